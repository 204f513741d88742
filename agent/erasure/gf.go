package erasure

// GF(2^8) with the polynomial x^8+x^4+x^3+x^2+1 (0x11d), the field
// klauspost/reedsolomon computes in, so the matrices built here decode with
// its kernels. Only the parity matrix is built here; the data path is
// entirely klauspost's SIMD code.

var gfExp, gfLog = func() (exp [510]byte, log [256]int) {
	x := 1
	for i := range 255 {
		exp[i], exp[i+255] = byte(x), byte(x)
		log[x] = i
		x <<= 1
		if x&0x100 != 0 {
			x ^= 0x11d
		}
	}
	return exp, log
}()

func gfMul(a, b byte) byte {
	if a == 0 || b == 0 {
		return 0
	}
	return gfExp[gfLog[a]+gfLog[b]]
}

// gfInv is the multiplicative inverse; x must not be 0.
func gfInv(x byte) byte { return gfExp[255-gfLog[x]] }

// cauchyRows is the K x D parity matrix row[t][c] = 1/((D+t) xor c), the
// same as klauspost's WithCauchyMatrix. Every square submatrix of a Cauchy
// matrix is invertible, so [I; C] is MDS: any D of the D+K units decode.
func cauchyRows(d, k int) [][]byte {
	rows := make([][]byte, k)
	for t := range rows {
		rows[t] = make([]byte, d)
		for c := range d {
			rows[t][c] = gfInv(byte((d + t) ^ c))
		}
	}
	return rows
}
