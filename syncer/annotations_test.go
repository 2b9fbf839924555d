package syncer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/poolalloc/poolalloc/syncer"
	"github.com/poolalloc/poolalloc/syncer/syncertest"
)

const testNamespace = "claims"

// claimGVK is a made-up kind for unstructured claims.
var claimGVK = schema.GroupVersionKind{Group: "test.poolalloc.io", Version: "v1", Kind: "Claim"}

// newFakeClient returns a fake client that knows core/v1 (ConfigMap stands
// in for a typed claim) and learns claimGVK on first use.
func newFakeClient(t *testing.T, funcs *interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, corev1.AddToScheme(scheme))
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	if funcs != nil {
		b = b.WithInterceptorFuncs(*funcs)
	}
	return b.Build()
}

func typedClaim(name string) client.Object {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name}}
}

func unstructuredClaim(name string) client.Object {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(claimGVK)
	u.SetNamespace(testNamespace)
	u.SetName(name)
	_ = unstructured.SetNestedField(u.Object, "pool-a", "spec", "pool")
	return u
}

func TestAnnotationSyncerConformance(t *testing.T) {
	kinds := []struct {
		name     string
		newClaim func(string) client.Object
	}{
		{"Typed", typedClaim},
		{"Unstructured", unstructuredClaim},
	}
	keys := []struct {
		name string
		keys syncer.Keys
	}{
		{"DefaultKeys", syncer.DefaultKeys()},
		{"OpenSandboxKeys", syncer.OpenSandboxKeys()},
	}
	for _, kind := range kinds {
		for _, k := range keys {
			t.Run(kind.name+"/"+k.name, func(t *testing.T) {
				t.Parallel()
				syncertest.Run(t, func(t *testing.T) (syncer.AllocationSyncer, client.Client, func(string) client.Object) {
					c := newFakeClient(t, nil)
					s, err := syncer.NewAnnotationSyncer(c, k.keys)
					require.NoError(t, err)
					return s, c, kind.newClaim
				})
			})
		}
	}
}

func TestNewAnnotationSyncer(t *testing.T) {
	c := newFakeClient(t, nil)
	_, err := syncer.NewAnnotationSyncer(nil, syncer.DefaultKeys())
	require.ErrorIs(t, err, syncer.ErrInvalidOption, "nil client")

	bad := syncer.DefaultKeys()
	bad.Released = bad.Allocated
	_, err = syncer.NewAnnotationSyncer(c, bad)
	require.ErrorIs(t, err, syncer.ErrInvalidKeys)

	_, err = syncer.NewAnnotationSyncer(c, syncer.DefaultKeys(), syncer.WithAPIReader(nil))
	require.ErrorIs(t, err, syncer.ErrInvalidOption, "nil API reader")

	_, err = syncer.NewAnnotationSyncer(c, syncer.DefaultKeys(), nil)
	require.ErrorIs(t, err, syncer.ErrInvalidOption, "nil option")

	s, err := syncer.NewAnnotationSyncer(c, syncer.OpenSandboxKeys(), syncer.WithAPIReader(c))
	require.NoError(t, err)
	require.Equal(t, syncer.OpenSandboxKeys(), s.Keys())
}

// setup creates one claim of each kind and returns the syncer, the client
// and the claims as stored.
func setup(t *testing.T, funcs *interceptor.Funcs, keys syncer.Keys) (*syncer.AnnotationSyncer, client.Client, []client.Object) {
	t.Helper()
	c := newFakeClient(t, funcs)
	s, err := syncer.NewAnnotationSyncer(c, keys)
	require.NoError(t, err)
	var claims []client.Object
	for _, obj := range []client.Object{typedClaim("typed"), unstructuredClaim("unstructured")} {
		obj.SetFinalizers([]string{"example.com/other"})
		obj.SetAnnotations(map[string]string{"example.com/note": "x"})
		require.NoError(t, c.Create(t.Context(), obj))
		claims = append(claims, obj)
	}
	return s, c, claims
}

func TestWritePatchFailureLeavesClaimAlone(t *testing.T) {
	boom := apierrors.NewServiceUnavailable("etcd is gone")
	var patches int
	funcs := &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			patches++
			// A client may have decoded part of a response into obj
			// before failing.
			obj.SetAnnotations(map[string]string{"half": "written"})
			obj.SetFinalizers(nil)
			return boom
		},
	}
	s, _, claims := setup(t, funcs, syncer.DefaultKeys())
	for _, claim := range claims {
		before := claim.DeepCopyObject()
		out, err := s.Write(t.Context(), claim, syncer.Record{Allocated: []string{"pod-a"}}, true)
		require.Nil(t, out)
		require.ErrorIs(t, err, boom)
		require.True(t, apierrors.IsServiceUnavailable(err), "status of the wrapped error is lost: %v", err)
		require.Contains(t, err.Error(), testNamespace+"/"+claim.GetName())
		require.Equal(t, before, claim, "failed Write modified the claim")
	}
	require.Equal(t, len(claims), patches)
}

func TestWritePatch(t *testing.T) {
	var sent []map[string]any
	funcs := &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			data, err := patch.Data(obj)
			if err != nil {
				return err
			}
			var m map[string]any
			if err := json.Unmarshal(data, &m); err != nil {
				return err
			}
			sent = append(sent, m)
			return c.Patch(ctx, obj, patch, opts...)
		},
	}
	keys := syncer.OpenSandboxKeys()
	s, _, claims := setup(t, funcs, keys)
	for _, claim := range claims {
		sent = nil
		out, err := s.Write(t.Context(), claim, syncer.Record{Allocated: []string{"pod-b", "pod-a"}}, true)
		require.NoError(t, err)
		out, err = s.Write(t.Context(), out, syncer.Record{Allocated: []string{"pod-b", "pod-a"}, Released: []string{"pod-a"}}, false)
		require.NoError(t, err)
		out, err = s.Write(t.Context(), out, syncer.Record{}, false)
		require.NoError(t, err)

		require.Len(t, sent, 3)
		// A merge patch of metadata only, carrying the resourceVersion it
		// was based on.
		for i, m := range sent {
			require.Len(t, m, 1, "patch %d touches more than metadata: %v", i, m)
			meta := m["metadata"].(map[string]any)
			require.NotEmpty(t, meta["resourceVersion"], "patch %d has no resourceVersion: %v", i, m)
		}
		meta := sent[0]["metadata"].(map[string]any)
		require.Equal(t, map[string]any{keys.Allocated: `{"pods":["pod-b","pod-a"]}`}, meta["annotations"])
		require.Equal(t, []any{"example.com/other", keys.Finalizer}, meta["finalizers"])
		meta = sent[1]["metadata"].(map[string]any)
		require.Equal(t, map[string]any{keys.Released: `{"pods":["pod-a"]}`}, meta["annotations"])
		require.Equal(t, []any{"example.com/other"}, meta["finalizers"])
		meta = sent[2]["metadata"].(map[string]any)
		require.Equal(t, map[string]any{keys.Allocated: nil, keys.Released: nil}, meta["annotations"], "empty lists remove their annotation")

		require.Equal(t, map[string]string{"example.com/note": "x"}, out.GetAnnotations())
		require.Equal(t, []string{"example.com/other"}, out.GetFinalizers())
	}
}

func TestWriteRefusedBeforeSending(t *testing.T) {
	funcs := &interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			t.Errorf("Patch called for %s", obj.GetName())
			return errors.New("must not be called")
		},
	}
	s, _, claims := setup(t, funcs, syncer.DefaultKeys())
	huge := make([]string, 27000) // 13 bytes each, encoded
	for i := range huge {
		huge[i] = fmt.Sprintf("p%09d", i)
	}
	for _, claim := range claims {
		for _, tc := range []struct {
			name string
			rec  syncer.Record
			err  error
			key  string
		}{
			{"too large", syncer.Record{Allocated: huge}, syncer.ErrRecordTooLarge, "poolalloc.io/allocated"},
			{"too large together", syncer.Record{Allocated: huge[:12000], Released: huge[11000:]}, syncer.ErrRecordTooLarge, "poolalloc.io/released"},
			{"pod twice", syncer.Record{Allocated: []string{"a", "b", "a"}}, syncer.ErrMalformedRecord, "poolalloc.io/allocated"},
			{"invalid name", syncer.Record{Released: []string{"Pod_A"}}, syncer.ErrMalformedRecord, "poolalloc.io/released"},
		} {
			before := claim.DeepCopyObject()
			_, err := s.Write(t.Context(), claim, tc.rec, true)
			require.ErrorIs(t, err, tc.err, tc.name)
			var re *syncer.RecordError
			require.ErrorAs(t, err, &re, tc.name)
			require.Equal(t, types.NamespacedName{Namespace: testNamespace, Name: claim.GetName()}, re.Claim, tc.name)
			require.Equal(t, tc.key, re.Key, tc.name)
			require.Equal(t, before, claim, tc.name)
		}
		noRV := claim.DeepCopyObject().(client.Object)
		noRV.SetResourceVersion("")
		_, err := s.Write(t.Context(), noRV, syncer.Record{}, false)
		require.ErrorContains(t, err, "resourceVersion")
	}
}

func TestWriteSizeLimitIsExact(t *testing.T) {
	s, c, claims := setup(t, nil, syncer.DefaultKeys())
	for _, claim := range claims {
		// Fill the annotations to exactly the limit, then one byte over.
		other := 0
		for k, v := range claim.GetAnnotations() {
			other += len(k) + len(v)
		}
		value, err := syncer.EncodePods([]string{"a"})
		require.NoError(t, err)
		pad := syncer.MaxAnnotationsSize - other - len("poolalloc.io/allocated") - len(value) - len("example.com/pad")
		cp := claim.DeepCopyObject().(client.Object)
		ann := cp.GetAnnotations()
		ann["example.com/pad"] = strings.Repeat("x", pad)
		cp.SetAnnotations(ann)
		require.NoError(t, c.Patch(t.Context(), cp, client.MergeFrom(claim)))

		out, err := s.Write(t.Context(), cp, syncer.Record{Allocated: []string{"a"}}, true)
		require.NoError(t, err, "a record that fills the limit exactly")
		_, err = s.Write(t.Context(), out, syncer.Record{Allocated: []string{"ab"}}, true)
		require.ErrorIs(t, err, syncer.ErrRecordTooLarge, "one byte over")
	}
}

func TestGetUsesAPIReader(t *testing.T) {
	cached := newFakeClient(t, nil)
	live := newFakeClient(t, nil)
	for _, c := range []client.Client{cached, live} {
		require.NoError(t, c.Create(t.Context(), typedClaim("claim")))
	}
	fresh := typedClaim("claim")
	require.NoError(t, live.Get(t.Context(), client.ObjectKeyFromObject(fresh), fresh))
	fresh.SetLabels(map[string]string{"fresh": "yes"})
	require.NoError(t, live.Update(t.Context(), fresh))

	s, err := syncer.NewAnnotationSyncer(cached, syncer.DefaultKeys(), syncer.WithAPIReader(live))
	require.NoError(t, err)
	got, err := s.Get(t.Context(), typedClaim("claim"))
	require.NoError(t, err)
	require.Equal(t, "yes", got.GetLabels()["fresh"])
	require.IsType(t, &corev1.ConfigMap{}, got)

	failing := interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		return apierrors.NewTimeoutError("slow", 1)
	}}
	s, err = syncer.NewAnnotationSyncer(cached, syncer.DefaultKeys(), syncer.WithAPIReader(newFakeClient(t, &failing)))
	require.NoError(t, err)
	_, err = s.Get(t.Context(), typedClaim("claim"))
	require.True(t, apierrors.IsTimeout(err), "want the reader's error, got %v", err)
	require.Contains(t, err.Error(), testNamespace+"/claim")
}

func TestRead(t *testing.T) {
	keys := syncer.OpenSandboxKeys()
	mk := func(ann map[string]string) client.Object {
		obj := unstructuredClaim("c")
		obj.SetAnnotations(ann)
		return obj
	}
	s, err := syncer.NewAnnotationSyncer(newFakeClient(t, nil), keys)
	require.NoError(t, err)

	// As OpenSandbox's controller marshals it, order kept, released pods
	// not in allocated accepted.
	type pods struct {
		Pods []string `json:"pods"`
	}
	marshal := func(p []string) string {
		b, err := json.Marshal(pods{p})
		require.NoError(t, err)
		return string(b)
	}
	rec, err := s.Read(mk(map[string]string{
		keys.Allocated: marshal([]string{"pod-c", "pod-a", "pod-b"}),
		keys.Release:   marshal(nil),
		keys.Released:  marshal([]string{"pod-a", "pod-gone"}),
		"other":        "{",
	}))
	require.NoError(t, err)
	require.Equal(t, syncer.Record{Allocated: []string{"pod-c", "pod-a", "pod-b"}, Released: []string{"pod-a", "pod-gone"}}, rec)
	require.Equal(t, []string{"pod-c", "pod-b"}, rec.Held())

	rec, err = s.Read(mk(nil))
	require.NoError(t, err)
	require.Equal(t, syncer.Record{}, rec)

	for _, key := range []string{keys.Allocated, keys.Released} {
		obj := mk(map[string]string{key: `{"pods":["a","b","a"]}`})
		before := obj.DeepCopyObject()
		_, err := s.Read(obj)
		var re *syncer.RecordError
		require.ErrorAs(t, err, &re)
		require.Equal(t, &syncer.RecordError{Claim: types.NamespacedName{Namespace: testNamespace, Name: "c"}, Key: key, Reason: `pod "a" listed twice`, Err: syncer.ErrMalformedRecord}, re)
		require.Equal(t, `claim claims/c: record `+key+`: pod "a" listed twice: malformed record`, err.Error())
		require.NotErrorIs(t, err, syncer.ErrMalformedRelease)
		require.Equal(t, before, obj)
	}

	// The owner's release list alone: the rest of the record comes back
	// with the error, which matches both sentinels.
	obj := mk(map[string]string{keys.Release: `{"pods":["a","b","a"]}`, keys.Allocated: marshal([]string{"x"})})
	rec, err = s.Read(obj)
	var re *syncer.RecordError
	require.ErrorAs(t, err, &re)
	require.Equal(t, &syncer.RecordError{Claim: types.NamespacedName{Namespace: testNamespace, Name: "c"}, Key: keys.Release, Reason: `pod "a" listed twice`, Err: syncer.ErrMalformedRelease}, re)
	require.ErrorIs(t, err, syncer.ErrMalformedRecord)
	require.ErrorIs(t, err, syncer.ErrMalformedRelease)
	require.Equal(t, syncer.Record{Allocated: []string{"x"}}, rec)

	// Only an object built in memory can be this large.
	_, err = s.Read(mk(map[string]string{keys.Released: marshal([]string{"a"}), "big": strings.Repeat("x", syncer.MaxAnnotationsSize)}))
	require.ErrorAs(t, err, &re)
	require.ErrorIs(t, err, syncer.ErrRecordTooLarge)
	require.Equal(t, keys.Released, re.Key)
}

func TestNilClaim(t *testing.T) {
	s, err := syncer.NewAnnotationSyncer(newFakeClient(t, nil), syncer.DefaultKeys())
	require.NoError(t, err)
	for _, claim := range []client.Object{nil, (*corev1.ConfigMap)(nil), (*unstructured.Unstructured)(nil)} {
		_, err := s.Read(claim)
		require.Error(t, err)
		_, err = s.Write(t.Context(), claim, syncer.Record{}, true)
		require.Error(t, err)
		_, err = s.Get(t.Context(), claim)
		require.Error(t, err)
		require.False(t, s.HasFinalizer(claim))
	}
}

func TestOpenSandboxFormatKeepsRepeats(t *testing.T) {
	keys := syncer.OpenSandboxKeys()
	claim := typedClaim("sbx")
	c := newFakeClient(t, nil, claim)
	strict, err := syncer.NewAnnotationSyncer(c, keys)
	require.NoError(t, err)
	s, err := syncer.NewAnnotationSyncer(c, keys, syncer.WithOpenSandboxFormat())
	require.NoError(t, err)

	// What OpenSandbox's controller writes after handing a released pod
	// back to the same sandbox.
	live := &corev1.ConfigMap{}
	require.NoError(t, c.Get(context.Background(), client.ObjectKeyFromObject(claim), live))
	live.Annotations = map[string]string{
		keys.Allocated: `{"pods":["p-0","p-0","p-2"]}`,
		keys.Release:   `{"pods":["p-0","p-0"]}`,
		keys.Released:  `{"pods":["p-0"]}`,
	}
	require.NoError(t, c.Update(context.Background(), live))

	rec, err := s.Read(live)
	require.NoError(t, err)
	require.Equal(t, syncer.Record{Allocated: []string{"p-0", "p-0", "p-2"}, Release: []string{"p-0", "p-0"}, Released: []string{"p-0"}}, rec,
		"lists as written")
	require.Equal(t, []string{"p-2"}, rec.Held(), "a released pod is not held however often it is listed")

	_, err = strict.Read(live)
	require.ErrorIs(t, err, syncer.ErrMalformedRecord, "repeats are malformed without the format")

	// Written back as given, repeats and order kept; names still checked.
	rec.Allocated = append(rec.Allocated, "p-3")
	out, err := s.Write(context.Background(), live, rec, true)
	require.NoError(t, err)
	require.Equal(t, `{"pods":["p-0","p-0","p-2","p-3"]}`, out.GetAnnotations()[keys.Allocated])
	require.Equal(t, `{"pods":["p-0"]}`, out.GetAnnotations()[keys.Released])
	_, err = s.Write(context.Background(), out, syncer.Record{Allocated: []string{"p-0", "Bad_Name"}}, true)
	require.ErrorIs(t, err, syncer.ErrMalformedRecord)
	_, err = strict.Write(context.Background(), out, syncer.Record{Allocated: []string{"p-0", "p-0"}}, true)
	require.ErrorIs(t, err, syncer.ErrMalformedRecord)
}

func TestRecordHeldCountsEachPodOnce(t *testing.T) {
	for _, tc := range []struct {
		rec  syncer.Record
		want []string
	}{
		{syncer.Record{}, nil},
		{syncer.Record{Allocated: []string{"b", "a"}}, []string{"b", "a"}},
		{syncer.Record{Allocated: []string{"b", "a", "b"}}, []string{"b", "a"}},
		{syncer.Record{Allocated: []string{"b", "a", "b", "c"}, Released: []string{"b"}}, []string{"a", "c"}},
		{syncer.Record{Allocated: []string{"a"}, Released: []string{"x"}}, []string{"a"}},
	} {
		require.Equal(t, tc.want, tc.rec.Held(), "%+v", tc.rec)
	}
	// Long lists take the map path.
	var long []string
	for i := range 40 {
		long = append(long, fmt.Sprintf("p-%d", i%20))
	}
	held := syncer.Record{Allocated: long}.Held()
	require.Len(t, held, 20)
	require.Equal(t, long[:20], held)
}
