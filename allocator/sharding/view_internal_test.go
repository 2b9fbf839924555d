package sharding

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// Changes far quicker than RenewInterval (a test calling Sync in a loop)
// keep at most maxPast past views: the oldest merge into a gap, which
// makes Owns wait, never serve early; one RenewInterval after the last
// change the replica owns its pools again.
func TestPastViewsStayBounded(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m, err := New(c, Options{Namespace: "leases", Group: "g", Identity: "a", LeaseDuration: 3 * time.Second,
		RenewInterval: time.Second, Clock: clk})
	require.NoError(t, err)
	require.NoError(t, m.Sync(ctx))
	clk.Step(2 * time.Second)
	require.NoError(t, m.Sync(ctx))
	ps := pools(100)
	for _, p := range ps {
		require.True(t, m.Owns(p))
	}
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "leases", Name: leaseName("g", "x"),
		Labels: map[string]string{GroupLabel: "g"}}}
	for i := range 3*maxPast + 1 {
		clk.Step(10 * time.Millisecond)
		if i%2 == 0 {
			l := other.DeepCopy()
			l.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("x"), LeaseDurationSeconds: ptr.To(int32(3)),
				RenewTime: ptr.To(metav1.NewMicroTime(clk.Now()))}
			require.NoError(t, c.Create(ctx, l))
		} else {
			require.NoError(t, c.Delete(ctx, other.DeepCopy()))
		}
		require.NoError(t, m.Sync(ctx))
		require.LessOrEqual(t, len(m.past), maxPast)
		for _, p := range ps {
			if m.Owns(p) {
				for _, v := range m.past {
					require.False(t, v.gap, "owns %s with a gap within the grace", p)
					require.Equal(t, "a", v.owner(false, p))
				}
			}
		}
	}
	last := clk.Now()
	clk.Step(time.Second - time.Nanosecond)
	require.Equal(t, "x", m.Members()[len(m.Members())-1], "the last change was a join")
	clk.Step(time.Nanosecond)
	require.Equal(t, time.Second, clk.Now().Sub(last))
	for _, p := range ps {
		require.Equal(t, m.Owner(p) == "a", m.Owns(p), "pool %s", p)
	}
}
