// Package blocks hands out entries from blocks of many, one allocation for
// a block instead of one per entry: for code that makes thousands of
// entries at once (a pool's recovery).
package blocks

// Size is the most entries a block holds.
const Size = 256

// Blocks hands out zeroed entries of type T from blocks of at most Size.
// A block stays in memory while any entry of it is in use, so the blocks
// hold at most what their entries would, made one by one. The zero value
// is ready; a Blocks is for one goroutine.
type Blocks[T any] struct{ free []T }

// Next returns a zeroed entry; left is how many more the caller will ask
// for, this one included, so that the last block is no larger than needed.
func (b *Blocks[T]) Next(left int) *T {
	if len(b.free) == 0 {
		b.free = make([]T, min(max(left, 1), Size))
	}
	e := &b.free[0]
	b.free = b.free[1:]
	return e
}
