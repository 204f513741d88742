package erasure

import "errors"

// Errors that callers tell apart with errors.Is; every returned error wraps
// one of them with the numbers that caused it and what to change.
var (
	// ErrParams: a group size, parity count, copy count or member index is
	// out of range.
	ErrParams = errors.New("erasure: invalid parameters")
	// ErrSize: a shard, parity or slice buffer has the wrong length, or an
	// argument list has the wrong number of entries.
	ErrSize = errors.New("erasure: wrong buffer size")
	// ErrTooManyLosses: more units are missing than the code tolerates; the
	// restore planner falls back to the persistent checkpoint on this.
	ErrTooManyLosses = errors.New("erasure: more losses than the redundancy tolerates")
)
