// Package runpath names the files an agent and the SPANK plugin share on a
// node, and reads a unix socket peer's credentials. It is a leaf package:
// the plugin, which slurmstepd loads as root, imports it instead of agent,
// so that the root-loaded library links neither the agent's store, erasure
// codes nor its mesh.
package runpath

import (
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// File names inside the job's run directory (<run_dir>/<jobid>/).
const (
	SocketName = "agent.sock"
	LockName   = "agent.lock"  // flock held by the live agent; holds its pid
	ErrorName  = "agent.error" // one line: why the agent could not start
	// CarryName holds the metrics counters an agent leaves for the job's
	// next agent on the node (agent/metrics); CarryTempName is where it is
	// written before the rename onto CarryName.
	CarryName     = "metrics-carry.json"
	CarryTempName = ".metrics-carry.json.tmp"
)

// RunDirFiles are all the names an agent may leave in the job's run
// directory: the plugin removes these, and only these, when the job ends
// on the node, then the directory.
var RunDirFiles = []string{SocketName, LockName, ErrorName, CarryName, CarryTempName}

// JobRunDir is the per-job runtime directory (mode 0700, the job's user).
func JobRunDir(runDir, job string) string { return filepath.Join(runDir, job) }

// SocketPath is where the agent of a job listens: <runDir>/<job>/agent.sock.
func SocketPath(runDir, job string) string {
	return filepath.Join(JobRunDir(runDir, job), SocketName)
}

// UserStoreDir is the user's directory under the store root, <root>/<uid>,
// which the plugin creates as root and hands to the user (mode 0700); the
// agent makes the job's directory inside it (tmpfs.JobPath).
func UserStoreDir(tmpfsRoot string, uid int) string {
	return filepath.Join(tmpfsRoot, strconv.Itoa(uid))
}

// PeerCred returns the credentials of the process at the other end of c.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, serr
}
