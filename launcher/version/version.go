// Package version holds the reft release string, stamped at link time.
package version

// Version is set with -ldflags "-X github.com/reft-hpc/reft/launcher/version.Version=...".
var Version = "0.1.0-dev"
