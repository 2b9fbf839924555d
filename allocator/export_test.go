package allocator

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// CheckInvariants runs the allocator's self-check (see checkInvariants).
func CheckInvariants(a Allocator) error { return a.(*defaultAllocator).checkInvariants() }

// DumpState describes what a believes of pool's pods and claims, one line
// each, for the many-allocator machine's failure dumps.
func DumpState(al Allocator, pool types.NamespacedName) string {
	a := al.(*defaultAllocator)
	a.mu.Lock()
	p := a.pools[pool]
	a.mu.Unlock()
	if p == nil {
		return "      (pool unknown)\n"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	pis := p.pods.Entries()
	slices.SortFunc(pis, func(x, y *podInfo) int { return strings.Compare(x.name(), y.name()) })
	for _, pi := range pis {
		name := pi.name()
		fmt.Fprintf(&b, "      pod %s %s@%s present=%v ready=%v mark=%q markRV=%d own=%v", name, pi.uid(), pi.rv, pi.present, pi.ready, pi.mark, pi.markRV, pi.markOwn)
		if h := p.holderOf(pi); h != nil {
			fmt.Fprintf(&b, " held-by=%s", h.name().Name)
		}
		if ci := pi.reservedBy(); ci != nil {
			fmt.Fprintf(&b, " reserved-for=%s", ci.name().Name)
		}
		if pi.settling() != nil {
			fmt.Fprintf(&b, " settling-for=%s", pi.settling().name().Name)
		}
		fmt.Fprintf(&b, " state=%s", pi.state)
		if next := pi.nextPod(); next != nil {
			fmt.Fprintf(&b, " next=%s@%s", next.uid(), next.rv)
		}
		b.WriteString("\n")
	}
	cis := p.claims.Entries()
	slices.SortFunc(cis, compareNames)
	for _, ci := range cis {
		var held []string
		for _, pi := range p.held(ci) {
			held = append(held, pi.name())
		}
		fmt.Fprintf(&b, "      claim %s listed=%v gone=%v want=%d recRV=%d held=%v strays=%v released=%v recycling=%d\n",
			ci.name().Name, ci.listed, ci.isGone(), ci.want, ci.recRV, held, ci.strays(), ci.released(), ci.recycling())
	}
	return b.String()
}

// ErrNoProto is errNoProto: a claim known only from a mark, in a pool
// whose listing showed no claim yet, cannot be read without WithClaimType.
var ErrNoProto = errNoProto
