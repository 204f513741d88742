package main

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// FrameReader reads one whole frame into buf and returns its length.
type FrameReader interface {
	ReadFrame(buf []byte) (int, error)
}

// FrameWriter sends one whole frame.
type FrameWriter interface {
	WriteFrame(frame []byte) error
}

// queueLen bounds the frames held at once, as netem's default limit (1000)
// does; 200 ms of the test jobs' traffic is far below it. A frame that
// finds the queue full is dropped, as a full link's queue drops it.
const queueLen = 1 << 14

// maxFrame is a GSO frame with its virtio-net header: up to 64 KiB of
// payload, and headroom.
const maxFrame = 1 << 17

// Relay copies frames from src to dst until either fails, each one delay
// after it was read, in the order read (delay 0: at once). Reads and
// writes run in two goroutines so that holding frames never slows reading
// them. A write the kernel refuses for want of buffers (ENOBUFS) drops the
// frame, said once on stderr; any other error ends the relay.
func Relay(src FrameReader, dst FrameWriter, delay time.Duration) error {
	return RelayCounting(src, dst, delay, new(atomic.Int64))
}

// RelayCounting is Relay that adds each frame it has written to sent.
func RelayCounting(src FrameReader, dst FrameWriter, delay time.Duration, sent *atomic.Int64) error {
	if delay <= 0 {
		buf := make([]byte, maxFrame)
		for {
			n, err := src.ReadFrame(buf)
			if err != nil {
				return err
			}
			if err := write(dst, buf[:n]); err != nil {
				return err
			}
			sent.Add(1)
		}
	}
	type held struct {
		at    time.Time
		frame []byte
	}
	q := make(chan held, queueLen)
	errc := make(chan error, 1)
	go func() {
		defer close(q)
		buf := make([]byte, maxFrame)
		warned := false
		for {
			n, err := src.ReadFrame(buf)
			if err != nil {
				errc <- err
				return
			}
			select {
			case q <- held{time.Now(), append([]byte(nil), buf[:n]...)}:
			default:
				if !warned {
					fmt.Fprintf(os.Stderr, "reft-delayline: %d frames held, queue full: dropping frames until it drains\n", queueLen)
					warned = true
				}
			}
		}
	}()
	for h := range q {
		time.Sleep(time.Until(h.at.Add(delay)))
		if err := write(dst, h.frame); err != nil {
			return err
		}
		sent.Add(1)
	}
	return <-errc
}

// warnedNoBufs: both directions' relays share the one warning.
var warnedNoBufs atomic.Bool

func write(dst FrameWriter, frame []byte) error {
	err := dst.WriteFrame(frame)
	if errors.Is(err, unix.ENOBUFS) {
		if warnedNoBufs.CompareAndSwap(false, true) {
			fmt.Fprintf(os.Stderr, "reft-delayline: %v: dropping the frame (and any later one refused so)\n", err)
		}
		return nil
	}
	return err
}
