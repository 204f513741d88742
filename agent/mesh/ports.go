package mesh

import "hash/fnv"

// NumCandidates is how many ports each node of a job may listen on.
const NumCandidates = 8

// Candidates returns the ports that the agent of node index i (of n in
// the job) tries, in order, within [lo, hi]: with span = hi-lo+1 and
// h = FNV-1a-32(job) mod span, candidate k is lo + (h + i + k*n) mod span
// for k = 0..7, duplicates dropped (a span below 8n). Every agent of the
// job computes every node's list from the job id and the allocation
// alone, so no rendezvous is needed; the lists of a job's nodes are
// disjoint when 8n <= span, so agents of one job never compete for a
// port even when several nodes share a host, and h spreads jobs apart.
func Candidates(job string, lo, hi, i, n int) []int {
	if lo < 1 || hi < lo || n < 1 || i < 0 || i >= n {
		return nil
	}
	span := uint64(hi - lo + 1)
	f := fnv.New32a()
	f.Write([]byte(job))
	h := uint64(f.Sum32()) % span
	out := make([]int, 0, NumCandidates)
	for k := range uint64(NumCandidates) {
		p := lo + int((h+uint64(i)+k*uint64(n))%span)
		dup := false
		for _, q := range out {
			dup = dup || q == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out
}
