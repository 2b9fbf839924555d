package allocator

import (
	"strconv"
	"testing"
)

// A refTable finds a ref's place by the ref's address, not by its bytes:
// the same name at another address is not found, or found at a place whose
// entry's ref it is not (sameString), which scanUnordered then refuses.
func TestRefTableFindsRefsByAddress(t *testing.T) {
	var l seenList[*podInfo]
	var table refTable
	const n = 1000
	for i := range n {
		pi := newPodInfo("pod-"+strconv.Itoa(i), "")
		l.add(pi)
		setRef(&table, l, pi.idx, pi.name())
	}
	if len(table.slots) < 2*n || table.used != n {
		t.Fatalf("table of %d slots, %d used, for %d refs: want at least %d slots, all refs in", len(table.slots), table.used, n, 2*n)
	}
	for i, s := range l {
		if got := table.lookup(s.v.ref); got != int32(i) {
			t.Fatalf("ref %s at %d is found at %d", s.v.ref, i, got)
		}
		other := copied(s.v.ref)
		if got := table.lookup(other); got >= 0 && sameString(l[got].v.ref, other) {
			t.Fatalf("a copy of %s is taken for the ref at %d", s.v.ref, got)
		}
	}
	if table.lookup("") != -1 {
		t.Fatal("the empty key finds a place")
	}
	// Places move (a removal moves the last stamp into the hole): the
	// table gives the old place until the ref is set again there.
	moved, removed := l[n-1].v, l[3].v
	l.remove(removed)
	if removed.ref != "" {
		t.Fatalf("an entry removed from its seenList keeps its ref %q", removed.ref)
	}
	if got := table.lookup(l[3].v.ref); got != n-1 {
		t.Fatalf("the moved ref is found at %d, want its old place %d (a stale hint)", got, n-1)
	}
	if !sameString(l[3].v.ref, moved.name()) {
		t.Fatal("the moved entry lost its ref")
	}
	setRef(&table, l, 3, l[3].v.ref)
	if got := table.lookup(l[3].v.ref); got != 3 {
		t.Fatalf("the moved ref is found at %d after setRef, want 3", got)
	}
}

// A table filled with refs that no entry keeps (strings of listings gone)
// is rebuilt from the entries' refs when full, so it stays sized for the
// entries.
func TestRefTableRebuildsWhenFull(t *testing.T) {
	var l seenList[*podInfo]
	var table refTable
	for i := range 100 {
		l.add(newPodInfo("pod-"+strconv.Itoa(i), ""))
	}
	for round := range 50 {
		for i := range l {
			setRef(&table, l, int32(i), copied(l[i].v.name())) // a new listing's strings
		}
		if table.used > len(table.slots)/4*3 || len(table.slots) > 1024 {
			t.Fatalf("round %d: %d of %d slots used for %d entries", round, table.used, len(table.slots), len(l))
		}
		for i := range l {
			if got := table.lookup(l[i].v.ref); got != int32(i) {
				t.Fatalf("round %d: ref of %d found at %d", round, i, got)
			}
		}
	}
}
