package allocator

// CheckInvariants runs the allocator's self-check (see checkInvariants).
func CheckInvariants(a Allocator) error { return a.(*defaultAllocator).checkInvariants() }
