package agent

import (
	"testing"

	"github.com/reft-hpc/reft/agent/config"
	"github.com/reft-hpc/reft/agent/runpath"
)

// The plugin computes the user's store directory with runpath (it links no
// tmpfs code); it must be the one the agent's stores live in.
func TestUserStoreDirMatchesRunpath(t *testing.T) {
	for _, uid := range []int{0, 1000, 4242} {
		c := config.Default()
		c.Store.TmpfsRoot = "/dev/shm/reft"
		if got, want := runpath.UserStoreDir(c.Store.TmpfsRoot, uid), UserStoreDir(c, uid); got != want {
			t.Errorf("uid %d: runpath.UserStoreDir %s, agent.UserStoreDir %s", uid, got, want)
		}
	}
}
