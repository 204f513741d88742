module github.com/reft-hpc/reft

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/emer/empi v1.0.22 // indirect
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	github.com/klauspost/reedsolomon v1.14.2 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/prometheus/procfs v0.23.0 // indirect
	github.com/rs/zerolog v1.35.1 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
