package client

import "github.com/reft-hpc/reft/agent/proto"

// Snapshot message types (docs/PROTOCOL.md, "Message types"). They are
// declared here rather than taken from agent/proto so that the client
// depends only on the codec and on the document.
const (
	tRegister    proto.Type = 0x03
	tSave        proto.Type = 0x04
	tCommit      proto.Type = 0x05
	tAbort       proto.Type = 0x06
	tGenerations proto.Type = 0x07
	tRestore     proto.Type = 0x08
	tRelease     proto.Type = 0x09
)

// Error codes an agent sends (docs/PROTOCOL.md, "Errors").
const (
	CodeForbidden   = "forbidden"
	CodeVersion     = "unsupported_version"
	CodeMalformed   = "malformed"
	CodeUnknownType = "unknown_type"
	CodeInternal    = "internal"
	CodeInvalid     = "invalid"
	CodeBadState    = "bad_state"
	CodeNoSpace     = "no_space"
	CodeNotFound    = "not_found"
	CodeMismatch    = "mismatch"
	CodeCorrupt     = "corrupt"
	CodeDisabled    = "disabled"
)

type wireBuffer struct {
	Name       string `json:"name"`
	Offset     int64  `json:"offset,omitempty"`
	Size       int64  `json:"size"`
	Replicated bool   `json:"replicated"`
}

type registerReq struct {
	Rank      int          `json:"rank"`
	World     int          `json:"world"`
	LocalRank int          `json:"local_rank"`
	Layout    string       `json:"layout"`
	ChunkSize int64        `json:"chunk_size"`
	Buffers   []wireBuffer `json:"buffers"`
}

type registerReply struct {
	Rank      int          `json:"rank"`
	ChunkSize int64        `json:"chunk_size"`
	ArenaSize int64        `json:"arena_size"`
	Buffers   []wireBuffer `json:"buffers"`
}

type stepReq struct {
	Step int64 `json:"step"`
}

// arenaReply is the save and the restore reply: where the generation's
// bytes are and how they are laid out.
type arenaReply struct {
	Step      int64        `json:"step"`
	Seq       uint64       `json:"seq"`
	Arena     string       `json:"arena"`
	ArenaSize int64        `json:"arena_size"`
	Buffers   []wireBuffer `json:"buffers"`
}

type commitReply struct {
	Step      int64   `json:"step"`
	Seq       uint64  `json:"seq"`
	Bytes     int64   `json:"bytes"`
	ChecksumS float64 `json:"checksum_s"`
}

// Generation is one committed generation of this rank on this node.
type Generation struct {
	Step  int64  `json:"step"`
	Seq   uint64 `json:"seq"`
	Bytes int64  `json:"bytes"`
}

type generationsReply struct {
	Rank        int          `json:"rank"`
	Generations []Generation `json:"generations"`
}
