package gpuhealth

// XIDs are the error codes the NVIDIA driver reports for a GPU (NVIDIA's
// "XID Errors" catalog, docs.nvidia.com/deploy/xid-errors). NVML delivers
// them as nvml.EventTypeXidCriticalError with the code in EventData.
//
// failingXIDs are the codes that mean the GPU or its driver state is
// broken: the job cannot continue on this node until the GPU is reset,
// the node rebooted, or the board replaced. Every other XID leaves the
// node ok; it is logged, and an XID missing from both tables with a
// warning, so a site can tell us what to add.
var failingXIDs = map[uint64]string{
	48:  "double-bit ECC error (uncorrectable GPU memory error)",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recorded after an uncorrectable error; the GPU needs a reset",
	64:  "ECC page retirement or row remapping failed",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error; the GPU needs a reset",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// appXIDs are caused by the application (a bad kernel, an illegal address,
// a killed context), not by the node: relaunching on the same GPU is the
// right recovery. The list is the one NVIDIA's Kubernetes device plugin
// skips when it marks devices unhealthy.
var appXIDs = map[uint64]string{
	13:  "graphics engine exception (application fault)",
	31:  "GPU memory page fault (application fault)",
	43:  "GPU stopped processing (application fault)",
	45:  "preemptive cleanup after an earlier error or a killed context",
	68:  "video decoder exception",
	109: "context switch timeout",
}
