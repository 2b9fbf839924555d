package allocator_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/allocator"
	"github.com/poolalloc/poolalloc/internal/testenv"
	"github.com/poolalloc/poolalloc/internal/world"
	"github.com/poolalloc/poolalloc/syncer"
)

// The allocator does not keep the claim objects it is given: with the
// annotation syncer it keeps their metadata and bases its writes on a slim
// object made from it. TestWritePatchUnchanged checks that the patches it
// sends are, byte for byte, those the syncer makes from the whole object,
// for typed and unstructured claims, plain or carrying labels, other
// annotations, other finalizers and a status: a hand-out (record and finalizer
// added), a second one on the version the allocator wrote, and a release
// (record emptied, finalizer removed).
func TestWritePatchUnchanged(t *testing.T) {
	for _, tc := range []struct{ unstructured, rich bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		unstructuredClaims := tc.unstructured
		t.Run("unstructured="+strconv.FormatBool(tc.unstructured)+",rich="+strconv.FormatBool(tc.rich), func(t *testing.T) {
			ctx := context.Background()
			var patches [][]byte
			c := newFakeClient(t, &interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if _, pod := obj.(*corev1.Pod); !pod {
						data, err := patch.Data(obj)
						require.NoError(t, err)
						patches = append(patches, data)
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
			})
			pool := types.NamespacedName{Namespace: "ns", Name: "p"}
			_, err := testenv.CreatePods(ctx, c, "ns", "p", 1, true)
			require.NoError(t, err)
			cl := testenv.NewClaim("ns", "a", "p", 2)
			cl.UID = "uid-a"
			other := ""
			if tc.rich {
				cl.Labels = map[string]string{"team": "x"}
				cl.Annotations = map[string]string{"example.com/note": "keep me", "example.com/empty": ""}
				cl.Finalizers = []string{"example.com/other"}
				cl.Status = map[string]any{"phase": "Pending"}
				other = `"example.com/other",`
			}
			require.NoError(t, c.Create(ctx, cl))

			a, err := allocator.New(c)
			require.NoError(t, err)
			list := func(want int) allocator.Input {
				in, err := world.Input(ctx, c, pool)
				if unstructuredClaims {
					in, err = world.UnstructuredInput(ctx, c, pool)
				}
				require.NoError(t, err)
				require.Len(t, in.Claims, 1)
				in.Claims[0].Want = want
				return in
			}
			// wantPatch is the patch the syncer makes from base, the whole
			// object, to write what the claim now holds on the server.
			wantPatch := func(base client.Object) []byte {
				var got []byte
				capture := newFakeClient(t, &interceptor.Funcs{
					Patch: func(_ context.Context, _ client.WithWatch, obj client.Object, patch client.Patch, _ ...client.PatchOption) error {
						data, err := patch.Data(obj)
						got = data
						return err
					},
				})
				s, err := syncer.NewAnnotationSyncer(capture, syncer.DefaultKeys())
				require.NoError(t, err)
				stored := &unstructured.Unstructured{}
				stored.SetGroupVersionKind(testenv.ClaimGVK)
				require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(base), stored))
				rec, err := s.Read(stored)
				require.NoError(t, err)
				_, err = s.Write(ctx, base, rec, s.HasFinalizer(stored))
				require.NoError(t, err)
				return got
			}

			// The claim gets the one pod there is, on the listed version.
			in := list(2)
			base := in.Claims[0].Object.DeepCopyObject().(client.Object)
			res, err := a.Round(ctx, in)
			require.NoError(t, err)
			require.Len(t, res.Allocated, 1)
			require.Len(t, patches, 1)
			require.Equal(t, string(wantPatch(base)), string(patches[0]))
			require.Contains(t, string(patches[0]), `"finalizers":[`+other+`"poolalloc.io/allocation"]`)

			// A second pod comes: the claim gets it, on the version the
			// allocator wrote, which the listing shows unchanged.
			extra := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p-extra", Labels: map[string]string{testenv.PoolLabel: "p"}}}
			require.NoError(t, c.Create(ctx, extra))
			require.NoError(t, testenv.SetPodReady(ctx, c, extra, true))
			in = list(2)
			base = in.Claims[0].Object.DeepCopyObject().(client.Object)
			res, err = a.Round(ctx, in)
			require.NoError(t, err)
			require.Len(t, res.Allocated, 1)
			require.Len(t, patches, 2)
			require.Equal(t, string(wantPatch(base)), string(patches[1]))

			// The owner scales the claim to 0.
			require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(cl), cl))
			cl.Spec.Replicas = 0
			require.NoError(t, c.Update(ctx, cl))
			in = list(0)
			base = in.Claims[0].Object.DeepCopyObject().(client.Object)
			res, err = a.Round(ctx, in)
			require.NoError(t, err)
			require.Len(t, res.Released, 1)
			require.Len(t, patches, 3)
			require.Equal(t, string(wantPatch(base)), string(patches[2]))
			if tc.rich {
				require.Contains(t, string(patches[2]), `"finalizers":["example.com/other"]`)
			} else {
				require.Regexp(t, `"finalizers":(null|\[\])`, string(patches[2]))
			}
		})
	}
}
