package peer

import (
	"encoding/hex"
	"fmt"
)

// A credit frame returning 4 MiB of window to request 7: the 32-byte
// header alone (the empty payload's CRC-32C is 0).
func ExampleAppendFrame() {
	b, _ := AppendFrame(nil, TCredit, 7, 4<<20, nil)
	fmt.Println(hex.EncodeToString(b[:16]))
	fmt.Println(hex.EncodeToString(b[16:]))
	// Output:
	// 52465450010700000000000700000000
	// 000000000040000000000000d21f79d9
}
