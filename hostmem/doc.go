// Package hostmem provides the shared, page-locked host-memory arenas that
// snapshots live in.
//
// An arena is a file in the node-local snapshot store (a tmpfs, or a
// hugetlbfs mount when configured), mapped MAP_SHARED. The agent creates it
// with Allocator.Create, which charges it to a memory Budget, reserves its
// pages up front (so a full tmpfs is an error here, not a SIGBUS later),
// advises transparent huge pages and pins it with mlock within
// RLIMIT_MEMLOCK. A rank maps the same file with MapShared or MapSharedFD
// and writes snapshot bytes straight into it; those bytes outlive both the
// rank and the agent process, but not the node.
//
// When a GPU runtime is present, a HostRegistrar (see package
// hostmem/cuda) registers each mapping with it so device-to-host copies DMA
// directly into the arena. Registration covers one process's mapping, so
// it belongs in the process that copies from the device: the rank (the
// clients register their own mappings). The agent sets no HostRegistrar:
// it never touches a device.
package hostmem
