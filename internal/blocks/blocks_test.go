package blocks

import "testing"

type entry struct {
	n    int
	name string
}

// Next gives distinct zeroed entries, blocks of at most Size, and no block
// larger than what is left to give.
func TestNext(t *testing.T) {
	var b Blocks[entry]
	seen := map[*entry]bool{}
	const n = 2*Size + 3
	for i := range n {
		e := b.Next(n - i)
		if seen[e] {
			t.Fatalf("entry %d given twice", i)
		}
		if *e != (entry{}) {
			t.Fatalf("entry %d is not zero: %+v", i, *e)
		}
		if cap(b.free)+1 > Size {
			t.Fatalf("a block of more than %d entries", Size)
		}
		seen[e] = true
		e.n, e.name = i, "used"
	}
	if len(b.free) != 0 {
		t.Fatalf("%d entries left over: the last block is larger than needed", len(b.free))
	}
	// A caller that miscounts (left 0) still gets an entry.
	var z Blocks[entry]
	if z.Next(0) == nil {
		t.Fatal("Next(0) returned nil")
	}
}
