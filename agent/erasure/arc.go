package erasure

import (
	"fmt"
	"slices"
)

// checkARC validates a group of m members keeping r copies of peers' shards.
// r must stay below m: r = m-1 already gives every member every shard.
func checkARC(m, r int) error {
	if m < 2 {
		return fmt.Errorf("%w: a sharding group of %d member(s) has no peer to copy to; ARC needs m >= 2", ErrParams, m)
	}
	if r < 1 || r >= m {
		return fmt.Errorf("%w: arc:%d in a group of %d: the copy count must be 1..%d (m-1), since a member never copies its own shard", ErrParams, r, m, m-1)
	}
	return nil
}

func checkMember(m, j int, what string) error {
	if j < 0 || j >= m {
		return fmt.Errorf("%w: %s %d is outside the sharding group 0..%d", ErrParams, what, j, m-1)
	}
	return nil
}

// ARCShards lists the peers' shards that member j copies under arc:r in a
// group of m: shards j+1 .. j+r (mod m), nearest first. Member j cuts them
// from its own replicated copy of the slice, so ARC needs no network.
func ARCShards(m, r, j int) ([]int, error) {
	if err := checkARC(m, r); err != nil {
		return nil, err
	}
	if err := checkMember(m, j, "member"); err != nil {
		return nil, err
	}
	out := make([]int, r)
	for c := range r {
		out[c] = (j + 1 + c) % m
	}
	return out, nil
}

// ARCHolders lists the members that keep a copy of shard i under arc:r:
// members i-1 .. i-r (mod m), nearest first. Shard i itself lives on member i.
func ARCHolders(m, r, i int) ([]int, error) {
	if err := checkARC(m, r); err != nil {
		return nil, err
	}
	if err := checkMember(m, i, "shard"); err != nil {
		return nil, err
	}
	out := make([]int, r)
	for c := range r {
		out[c] = ((i-1-c)%m + m) % m
	}
	return out, nil
}

// ARCSources picks, for every lost member's shard, the nearest surviving
// member that holds a copy of it: the plan for a replacement to fetch its
// shard. It fails with ErrTooManyLosses, naming the shards without a
// surviving copy, when r+1 consecutive members are lost.
func ARCSources(m, r int, lost []int) (map[int]int, error) {
	if err := checkARC(m, r); err != nil {
		return nil, err
	}
	dead := make([]bool, m)
	for _, i := range lost {
		if err := checkMember(m, i, "lost member"); err != nil {
			return nil, err
		}
		dead[i] = true
	}
	src := make(map[int]int)
	var orphan []int
	for i := range m {
		if !dead[i] {
			continue
		}
		holders, _ := ARCHolders(m, r, i)
		found := false
		for _, h := range holders {
			if !dead[h] {
				src[i], found = h, true
				break
			}
		}
		if !found {
			orphan = append(orphan, i)
		}
	}
	if len(orphan) > 0 {
		return nil, fmt.Errorf("%w: arc:%d in a group of %d lost members %v; shard(s) %v have no surviving copy (their holders are lost too); arc:%d tolerates %d loss(es) per group, or more only when no %d consecutive members are lost: restore from the persistent checkpoint",
			ErrTooManyLosses, r, m, sortedCopy(lost), orphan, r, r, r+1)
	}
	return src, nil
}

func sortedCopy(xs []int) []int {
	s := slices.Clone(xs)
	slices.Sort(s)
	return slices.Compact(s)
}
