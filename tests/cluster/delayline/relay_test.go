package main

import (
	"errors"
	"io"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// chanReader hands out the frames sent on it; closed, it reports io.EOF.
type chanReader chan []byte

func (c chanReader) ReadFrame(buf []byte) (int, error) {
	f, ok := <-c
	if !ok {
		return 0, io.EOF
	}
	return copy(buf, f), nil
}

type sent struct {
	at    time.Duration // since the test's start
	frame string
}

// recorder records each frame written and when.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	got   []sent
}

func (r *recorder) WriteFrame(f []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, sent{time.Since(r.start), string(f)})
	return nil
}

// TestRelay: each frame leaves exactly the delay after it arrived, in
// order, however they bunch (synctest's clock: no real waiting); without
// a delay at once; the reader's error ends the relay after the held
// frames are out.
func TestRelay(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		in    []time.Duration // arrival of frame i, since the start
	}{
		{"200 ms, spread", 200 * time.Millisecond, []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond}},
		{"200 ms, a burst", 200 * time.Millisecond, []time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 11 * time.Millisecond}},
		{"no delay", 0, []time.Duration{0, 5 * time.Millisecond, 5 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := make(chanReader)
				rec := &recorder{start: time.Now()}
				done := make(chan error, 1)
				go func() { done <- Relay(src, rec, tc.delay) }()
				var want []sent
				for i, at := range tc.in {
					time.Sleep(at - time.Since(rec.start))
					f := string(rune('a' + i))
					src <- []byte(f)
					want = append(want, sent{at + tc.delay, f})
				}
				close(src)
				if err := <-done; !errors.Is(err, io.EOF) {
					t.Fatalf("Relay ended with %v, want the reader's io.EOF", err)
				}
				if !slices.Equal(rec.got, want) {
					t.Errorf("written %v, want %v", rec.got, want)
				}
			})
		})
	}
}
