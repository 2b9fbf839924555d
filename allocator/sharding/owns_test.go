package sharding_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/poolalloc/poolalloc/allocator/sharding"
)

// The tests of Owns's timing drive each membership's Sync by hand on one
// fake clock, against the real API server: every instant is exact.

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// clocked is a membership of id in ns on clk, synced only by the test.
func clocked(t *testing.T, ns, id string, clk *clocktesting.FakeClock, byNS bool) *sharding.Membership {
	t.Helper()
	m, err := sharding.New(env.Client, sharding.Options{Namespace: ns, Group: "clocked", Identity: id,
		LeaseDuration: leaseDuration, RenewInterval: renew, Clock: clk, ByNamespace: byNS})
	require.NoError(t, err)
	return m
}

func syncAll(t *testing.T, ms ...*sharding.Membership) {
	t.Helper()
	for _, m := range ms {
		require.NoError(t, m.Sync(context.Background()))
	}
}

// spreadPools are pools in enough namespaces that, by namespace too, each
// member owns some. The names differ in their first letter: the 64-bit
// FNV-1a hash of names that differ only at the end barely moves its high
// bits, so such namespaces would crowd into one member's range of the ring.
func spreadPools() []types.NamespacedName {
	out := make([]types.NamespacedName, 0, 120)
	for i := range 60 {
		for j := range 2 {
			out = append(out, types.NamespacedName{Namespace: fmt.Sprintf("%c%d-team", 'a'+i%26, i), Name: fmt.Sprintf("pool-%d", j)})
		}
	}
	return out
}

// owned is the pools among pools that m owns (Owns) now.
func owned(m *sharding.Membership, pools []types.NamespacedName) []types.NamespacedName {
	var out []types.NamespacedName
	for _, p := range pools {
		if m.Owns(p) {
			out = append(out, p)
		}
	}
	return out
}

// ownedBy is the pools among pools whose owner by hashing (Owner) is id.
func ownedBy(m *sharding.Membership, id string, pools []types.NamespacedName) []types.NamespacedName {
	var out []types.NamespacedName
	for _, p := range pools {
		if m.Owner(p) == id {
			out = append(out, p)
		}
	}
	return out
}

func without(pools, drop []types.NamespacedName) []types.NamespacedName {
	var out []types.NamespacedName
	for _, p := range pools {
		if !contains(drop, p) {
			out = append(out, p)
		}
	}
	return out
}

func contains(pools []types.NamespacedName, p types.NamespacedName) bool {
	for _, q := range pools {
		if q == p {
			return true
		}
	}
	return false
}

// atMostOne fails if two of ms own one pool now.
func atMostOne(t *testing.T, pools []types.NamespacedName, ms ...*sharding.Membership) {
	t.Helper()
	for _, p := range pools {
		n := 0
		for _, m := range ms {
			if m.Owns(p) {
				n++
			}
		}
		require.LessOrEqual(t, n, 1, "pool %s has %d owners", p, n)
	}
}

func bothModes(t *testing.T, f func(t *testing.T, byNS bool)) {
	t.Run("by pool", func(t *testing.T) { f(t, false) })
	t.Run("by namespace", func(t *testing.T) { f(t, true) })
}

// A new replica owns nothing for one RenewInterval after its first Sync:
// it cannot know who served its pools, and their old owner serves them
// until its own next Sync. Pools that stay with the old owner are owned
// through the change without a pause.
func TestOwnsNewReplicaWaitsOneRenewInterval(t *testing.T) {
	bothModes(t, func(t *testing.T, byNS bool) {
		ns := env.Namespace(context.Background(), t)
		pools := spreadPools()
		clk := clocktesting.NewFakeClock(epoch)
		a := clocked(t, ns, "a", clk, byNS)
		syncAll(t, a)
		require.Empty(t, owned(a, pools), "a owns nothing right after its first Sync")
		clk.Step(renew - time.Nanosecond)
		require.Empty(t, owned(a, pools), "a owns nothing until RenewInterval has passed")
		clk.Step(time.Nanosecond)
		require.Equal(t, pools, owned(a, pools), "alone, a owns every pool one RenewInterval after its first Sync")

		clk.Step(renew)
		syncAll(t, a)
		n := clocked(t, ns, "n", clk, byNS)
		syncAll(t, n) // n joins
		moved := ownedBy(n, "n", pools)
		require.NotEmpty(t, moved)
		require.Empty(t, owned(n, pools), "n owns nothing right after its first Sync")
		require.Equal(t, pools, owned(a, pools), "a has not seen n: it still serves every pool")
		atMostOne(t, pools, a, n)

		clk.Step(renew / 2)
		syncAll(t, a) // a sees n
		require.Equal(t, without(pools, moved), owned(a, pools), "a keeps the pools that stayed its own without a pause")
		require.Empty(t, owned(n, pools))
		clk.Step(renew/2 - time.Nanosecond)
		require.Empty(t, owned(n, pools), "n owns nothing until RenewInterval after its first Sync")
		clk.Step(time.Nanosecond)
		require.Equal(t, moved, owned(n, pools), "n owns its pools RenewInterval after its first Sync")
		atMostOne(t, pools, a, n)
	})
}

// A new replica whose view changes again within RenewInterval of its
// first Sync (another joins) still waits one RenewInterval from the first.
func TestOwnsNewReplicaKeepsTheGraceThroughASecondChange(t *testing.T) {
	bothModes(t, func(t *testing.T, byNS bool) {
		ns := env.Namespace(context.Background(), t)
		pools := spreadPools()
		clk := clocktesting.NewFakeClock(epoch)
		a := clocked(t, ns, "a", clk, byNS)
		syncAll(t, a)
		clk.Step(2 * renew)
		syncAll(t, a)
		require.Equal(t, pools, owned(a, pools))

		n := clocked(t, ns, "n", clk, byNS)
		syncAll(t, n)
		first := ownedBy(n, "n", pools)
		joined := clk.Now()
		clk.Step(renew / 2)
		b := clocked(t, ns, "b", clk, byNS)
		syncAll(t, b, n) // b joins; n sees it
		require.Equal(t, []string{"a", "b", "n"}, n.Members())
		var kept []types.NamespacedName
		for _, p := range first {
			if n.Owner(p) == "n" {
				kept = append(kept, p)
			}
		}
		require.NotEmpty(t, kept, "some of n's pools stay n's when b joins")
		require.Empty(t, owned(n, pools), "n owns nothing RenewInterval/2 after its first Sync, a second change notwithstanding")
		require.Equal(t, pools, owned(a, pools), "a has not seen n nor b yet")

		clk.Step(joined.Add(renew).Sub(clk.Now()))
		require.Equal(t, kept, owned(n, pools), "n owns the pools it held in both views RenewInterval after its first Sync")
		syncAll(t, a)
		atMostOne(t, pools, a, b, n)
	})
}

// An established replica that gains pools when another leaves, then sees
// a third join within RenewInterval, serves the gained pools only
// RenewInterval after the leave; the one that left owns nothing from its
// Leave on.
func TestOwnsKeepsTheGraceThroughALeaveAndAJoin(t *testing.T) {
	bothModes(t, func(t *testing.T, byNS bool) {
		ctx := context.Background()
		ns := env.Namespace(ctx, t)
		pools := spreadPools()
		clk := clocktesting.NewFakeClock(epoch)
		a, b := clocked(t, ns, "a", clk, byNS), clocked(t, ns, "b", clk, byNS)
		syncAll(t, a, b, a)
		clk.Step(2 * renew)
		syncAll(t, a, b)
		mine, hers := ownedBy(a, "a", pools), ownedBy(a, "b", pools)
		require.NotEmpty(t, hers)
		require.Equal(t, mine, owned(a, pools))
		require.Equal(t, hers, owned(b, pools))

		require.NoError(t, b.Leave(ctx))
		syncAll(t, a) // a takes b's pools
		left := clk.Now()
		require.Equal(t, []string{"a"}, a.Members())
		require.Equal(t, mine, owned(a, pools), "a keeps its own pools without a pause")

		clk.Step(renew / 2)
		c := clocked(t, ns, "c", clk, byNS)
		syncAll(t, c, a) // c joins; a sees it
		var gained []types.NamespacedName
		for _, p := range hers {
			if a.Owner(p) == "a" {
				gained = append(gained, p)
			}
		}
		require.NotEmpty(t, gained, "some of b's pools go to a and stay with it when c joins")
		for _, p := range gained {
			require.False(t, a.Owns(p), "a owns %s, which came to it RenewInterval/2 ago, before the grace", p)
		}
		require.Equal(t, without(mine, ownedBy(a, "c", pools)), owned(a, pools))

		clk.Step(left.Add(renew).Sub(clk.Now()) - time.Nanosecond)
		for _, p := range gained {
			require.False(t, a.Owns(p), "a owns %s before RenewInterval after the leave", p)
		}
		clk.Step(time.Nanosecond)
		for _, p := range gained {
			require.True(t, a.Owns(p), "a does not own %s RenewInterval after the leave", p)
		}
		require.Empty(t, owned(b, pools), "b owns nothing once it left")
		atMostOne(t, pools, a, b, c)
	})
}

// A replica whose lease lapsed (its Syncs failed, or it stalled, for
// LeaseDuration) while the others counted it out owns nothing for one
// RenewInterval after its lease is renewed again: until then the others
// serve its pools, not having seen it back.
func TestOwnsWaitsAfterItsLeaseLapsed(t *testing.T) {
	bothModes(t, func(t *testing.T, byNS bool) {
		ns := env.Namespace(context.Background(), t)
		pools := spreadPools()
		clk := clocktesting.NewFakeClock(epoch)
		a, b := clocked(t, ns, "a", clk, byNS), clocked(t, ns, "b", clk, byNS)
		syncAll(t, a, b, a)
		clk.Step(2 * renew)
		syncAll(t, a, b)
		mine := ownedBy(a, "a", pools)
		require.NotEmpty(t, mine)
		require.Equal(t, mine, owned(a, pools))

		// a stops syncing; b counts it out once its lease expired.
		for range 100 {
			if len(b.Members()) == 1 {
				break
			}
			clk.Step(renew)
			syncAll(t, b)
		}
		require.Equal(t, []string{"b"}, b.Members())
		require.Empty(t, owned(a, pools), "a owns nothing once its lease went unrenewed for LeaseDuration")
		clk.Step(renew)
		require.Equal(t, pools, owned(b, pools), "b serves every pool")

		syncAll(t, a) // a is back, and sees b as before
		back := clk.Now()
		require.Equal(t, []string{"a", "b"}, a.Members())
		require.Empty(t, owned(a, pools), "a owns nothing right after its lease came back: b has not seen it")
		atMostOne(t, pools, a, b)
		clk.Step(renew / 2)
		syncAll(t, b) // b sees a back
		require.Equal(t, without(pools, mine), owned(b, pools))
		require.Empty(t, owned(a, pools))
		clk.Step(back.Add(renew).Sub(clk.Now()))
		require.Equal(t, mine, owned(a, pools), "a owns its pools RenewInterval after its lease came back")
		atMostOne(t, pools, a, b)
	})
}
