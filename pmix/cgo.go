//go:build cgo

package pmix

/*
#cgo pkg-config: pmix
#include <stdlib.h>
#include <string.h>
#include <pmix.h>

// get_val fetches key for rank r of me's namespace; the caller releases it.
static pmix_status_t get_val(const pmix_proc_t *me, uint32_t r, const char *key, pmix_value_t **val) {
	pmix_proc_t p;
	PMIX_PROC_CONSTRUCT(&p);
	PMIX_LOAD_NSPACE(p.nspace, me->nspace);
	p.rank = r;
	return PMIx_Get(&p, key, NULL, 0, val);
}

// get_u32 reads an integer-valued key for proc (rank r of nspace).
static pmix_status_t get_u32(const pmix_proc_t *me, uint32_t r, const char *key, uint32_t *out) {
	pmix_value_t *val = NULL;
	pmix_status_t rc = get_val(me, r, key, &val);
	if (rc != PMIX_SUCCESS) return rc;
	switch (val->type) {
	case PMIX_UINT32: *out = val->data.uint32; break;
	case PMIX_UINT16: *out = val->data.uint16; break;
	case PMIX_INT: *out = (uint32_t)val->data.integer; break;
	case PMIX_PROC_RANK: *out = val->data.rank; break;
	default: rc = PMIX_ERR_TYPE_MISMATCH;
	}
	PMIX_VALUE_RELEASE(val);
	return rc;
}

// get_host copies rank r's hostname into buf.
static pmix_status_t get_host(const pmix_proc_t *me, uint32_t r, char *buf, size_t n) {
	pmix_value_t *val = NULL;
	pmix_status_t rc = get_val(me, r, PMIX_HOSTNAME, &val);
	if (rc != PMIX_SUCCESS) return rc;
	if (val->type == PMIX_STRING && val->data.string != NULL) {
		strncpy(buf, val->data.string, n - 1);
		buf[n - 1] = 0;
	} else {
		rc = PMIX_ERR_TYPE_MISMATCH;
	}
	PMIX_VALUE_RELEASE(val);
	return rc;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

func pmixErr(what string, rc C.pmix_status_t) error {
	return fmt.Errorf("pmix: %s: %s (status %d)", what, C.GoString(C.PMIx_Error_string(rc)), int(rc))
}

// FromPMIx asks the PMIx server of the step. PMIx reference-counts
// initialization, so this is safe beside an MPI library that also uses PMIx.
func FromPMIx() (Topology, error) {
	var me C.pmix_proc_t
	if rc := C.PMIx_Init(&me, nil, 0); rc != C.PMIX_SUCCESS {
		return Topology{}, fmt.Errorf("%w: PMIx_Init: %s", ErrUnavailable, C.GoString(C.PMIx_Error_string(rc)))
	}
	defer C.PMIx_Finalize(nil, 0)

	var size, lrank, nodeid C.uint32_t
	wildcard := C.uint32_t(C.PMIX_RANK_WILDCARD)
	keySize, keyLRank, keyNode := C.CString(C.PMIX_JOB_SIZE), C.CString(C.PMIX_LOCAL_RANK), C.CString(C.PMIX_NODEID)
	defer C.free(unsafe.Pointer(keySize))
	defer C.free(unsafe.Pointer(keyLRank))
	defer C.free(unsafe.Pointer(keyNode))
	if rc := C.get_u32(&me, wildcard, keySize, &size); rc != C.PMIX_SUCCESS {
		return Topology{}, pmixErr("job size", rc)
	}
	if rc := C.get_u32(&me, C.uint32_t(me.rank), keyLRank, &lrank); rc != C.PMIX_SUCCESS {
		return Topology{}, pmixErr("local rank", rc)
	}
	if rc := C.get_u32(&me, C.uint32_t(me.rank), keyNode, &nodeid); rc != C.PMIX_SUCCESS {
		return Topology{}, pmixErr("node id", rc)
	}
	t := Topology{
		Rank: int(me.rank), Size: int(size), LocalRank: int(lrank), NodeID: int(nodeid),
		Nodes: make([]string, int(size)), Source: "pmix",
	}
	buf := (*C.char)(C.malloc(256))
	defer C.free(unsafe.Pointer(buf))
	for r := 0; r < t.Size; r++ {
		if rc := C.get_host(&me, C.uint32_t(r), buf, 256); rc != C.PMIX_SUCCESS {
			return Topology{}, pmixErr(fmt.Sprintf("hostname of rank %d", r), rc)
		}
		t.Nodes[r] = C.GoString(buf)
	}
	return t, nil
}
