package logging

import (
	"io"

	"github.com/rs/zerolog"
)

func newConsoleLogger(w io.Writer) zerolog.Logger { return zerolog.New(ConsoleWriter(w)) }
