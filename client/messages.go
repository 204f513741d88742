package client

import "github.com/reft-hpc/reft/agent/proto"

// Error codes an agent sends (docs/PROTOCOL.md, "Errors"), for comparing
// with Error.Code.
const (
	CodeForbidden   = proto.CodeForbidden
	CodeVersion     = proto.CodeVersion
	CodeMalformed   = proto.CodeMalformed
	CodeUnknownType = proto.CodeUnknownType
	CodeInternal    = proto.CodeInternal
	CodeInvalid     = proto.CodeInvalid
	CodeBadState    = proto.CodeBadState
	CodeNoSpace     = proto.CodeNoSpace
	CodeNotFound    = proto.CodeNotFound
	CodeMismatch    = proto.CodeMismatch
	CodeCorrupt     = proto.CodeCorrupt
	CodeDisabled    = proto.CodeDisabled
)
