// Package deps has no code: its test holds the module's packages to the
// dependency directions that docs/ARCHITECTURE.md draws ("Dependencies"),
// as `go list -deps` shows them.
package deps
