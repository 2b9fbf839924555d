package allocator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// serverNoops makes a fake client treat a merge patch as the API server
// does when the patch changes nothing: it checks the patch's
// resourceVersion precondition, writes nothing and returns the object at
// its unchanged resourceVersion. controller-runtime's fake client moves
// the resourceVersion on for every patch, which hides bugs that need a
// write to make a new version of an object.
func serverNoops(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if patch.Type() != types.MergePatchType || len(opts) > 0 {
				return c.Patch(ctx, obj, patch, opts...)
			}
			noop, err := isNoopPatch(ctx, c, obj, patch)
			if err != nil || !noop {
				return c.Patch(ctx, obj, patch, opts...)
			}
			return nil
		},
	})
}

// isNoopPatch reports whether the merge patch leaves obj's stored object
// as it is at the resourceVersion the patch names, if any; if so, it
// fills obj with the stored object. A patch whose precondition fails is
// not one: the fake client reports the conflict.
func isNoopPatch(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch) (bool, error) {
	data, err := patch.Data(obj)
	if err != nil {
		return false, err
	}
	var pre struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &pre); err != nil {
		return false, err
	}
	cur, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return false, fmt.Errorf("%T.DeepCopyObject is no client.Object", obj)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return false, err
	}
	if want := pre.Metadata.ResourceVersion; want != "" && want != cur.GetResourceVersion() {
		return false, nil // the fake client reports the conflict
	}
	raw, err := json.Marshal(cur)
	if err != nil {
		return false, err
	}
	merged, err := jsonpatch.MergePatch(raw, data)
	if err != nil {
		return false, err
	}
	var before, after any
	if err := json.Unmarshal(raw, &before); err != nil {
		return false, err
	}
	if err := json.Unmarshal(merged, &after); err != nil {
		return false, err
	}
	if !reflect.DeepEqual(before, after) {
		return false, nil
	}
	reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(cur).Elem())
	return true, nil
}
