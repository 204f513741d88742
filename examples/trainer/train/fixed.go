package train

import "math"

// Gradients are summed across microbatches and ranks as int64 fixed point,
// because integer addition is associative: the sum is the same whatever
// order MPI's reduction algorithm (or the microbatch split across DP ranks)
// adds them in. Each microbatch's value is clamped to +-fixLimit, so a sum of
// maxMicrobatches (2^10) of them is below 2^(fixShift+12+10) = 2^62.
const (
	fixShift = 40
	fixScale = float64(1 << fixShift)
	fixLimit = 1 << 12
)

// addFixed adds g to acc in fixed point and returns how many values were
// clamped (NaN counts as clamped and adds 0).
func addFixed(acc []int64, g []float32) (clamped int64) {
	acc = acc[:len(g)]
	for i, v := range g {
		x := float64(v)
		if !(x >= -fixLimit && x <= fixLimit) {
			clamped++
			switch {
			case x > 0:
				x = fixLimit
			case x < 0:
				x = -fixLimit
			default:
				x = 0
			}
		}
		acc[i] += int64(math.Round(x * fixScale))
	}
	return clamped
}

func toFixed(x float64) (int64, bool) {
	if !(x >= -fixLimit && x <= fixLimit) {
		return 0, false
	}
	return int64(math.Round(x * fixScale)), true
}

func fromFixed(acc []int64, g []float32) {
	g = g[:len(acc)]
	for i, a := range acc {
		g[i] = float32(float64(a) / fixScale)
	}
}
