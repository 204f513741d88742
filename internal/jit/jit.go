// Package jit is the Just-in-time checkpointing paper's optimal periodic
// checkpoint frequency (section 5, Eq. 3): a neutral model package, which
// imports only math, so that the agent (agent/persist) computes its
// persistent interval with the same math as `reft plan interval`
// (launcher/plan) without either importing the other.
package jit

import "math"

// SecondsPerDay converts failure rates given per day.
const SecondsPerDay = 86400

// OptimalPerSecond is JIT Eq. 3, c* = sqrt(N f / (2 o)): the checkpoint
// frequency (per second) that minimises wasted time for n failure units
// (GPUs, nodes) each failing fPerDay times a day, when one checkpoint costs
// oSeconds. The result is +Inf or NaN for inputs the model does not cover
// (o <= 0); callers validate them.
func OptimalPerSecond(n, fPerDay, oSeconds float64) float64 {
	return math.Sqrt(n * (fPerDay / SecondsPerDay) / (2 * oSeconds))
}

// OptimalInterval is 1/c*, the time between checkpoints in seconds.
func OptimalInterval(n, fPerDay, oSeconds float64) float64 {
	return 1 / OptimalPerSecond(n, fPerDay, oSeconds)
}
