package mesh

import "github.com/reft-hpc/reft/agent/slurmjob"

// The job's topology and the Slurm queries behind it live in the leaf
// package slurmjob (the SPANK plugin uses them without linking the mesh);
// these aliases keep mesh's API.
type (
	Node           = slurmjob.Node
	Topology       = slurmjob.Topology
	TopologySource = slurmjob.TopologySource
	Fixed          = slurmjob.Fixed
	Slurm          = slurmjob.Slurm
)
