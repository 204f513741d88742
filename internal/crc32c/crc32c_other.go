//go:build !amd64

package crc32c

import "hash/crc32"

// hasCLMUL512 is false off amd64: hash/crc32 has its own fast paths there.
const hasCLMUL512 = false

// updateCRC is crc32.Update(crc, castagnoli, p).
func updateCRC(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// copyCRC has no fast path off amd64.
func copyCRC(crc uint32, dst, src []byte) (uint32, bool) { return crc, false }

// ntMin is where the amd64 one-pass copy starts; the tests use its edges.
const ntMin = 1 << 20
