package train

import (
	"fmt"
	"slices"
	"sync"
)

// sendLog puts the messages a rank sends into its MessageLog, in one of two
// modes (--log-messages):
//
//   - sync: Append right after the send, on the training goroutine: the
//     copy lies on the step's critical path.
//   - bubble: the sent buffer is held until the rank next waits for a
//     message (recv, a pipeline bubble: SWIFT section 5.1), then handed to
//     a background goroutine that appends it. The buffer must not change
//     until then, so the trainer fences each send slot (fence) before it
//     writes that buffer again; a copy not finished by then is finished
//     there, and counted as forced.
//
// All methods but the worker's are called from the training goroutine.
type sendLog struct {
	log    MessageLog
	bubble bool
	act    []*logJob // per local microbatch: the job over its sent activations
	grad   []*logJob // per local microbatch: the job over its sent gradient
	held   []*logJob // bubble: sent, not yet handed to the worker
	jobs   chan *logJob
	exited chan struct{}

	mu  sync.Mutex
	err error // the worker's first Append error

	bytes, bubbleBytes, forcedBytes int64
}

type logJob struct {
	stream string
	step   int64
	seq    int
	buf    []float32 // the sent buffer; unchanged until done
	done   chan struct{}
	err    error
}

func newSendLog(l MessageLog, bubble bool, local int) *sendLog {
	s := &sendLog{log: l, bubble: bubble, act: make([]*logJob, local), grad: make([]*logJob, local)}
	if bubble {
		// Unbuffered would make release wait for the worker; two slots
		// per microbatch is everything a step can hold.
		s.jobs = make(chan *logJob, 2*local+2)
		s.exited = make(chan struct{})
		go s.worker()
	}
	return s
}

func (s *sendLog) worker() {
	defer close(s.exited)
	for j := range s.jobs {
		j.err = s.log.Append(j.stream, j.step, j.seq, j.buf)
		if j.err != nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = j.err
			}
			s.mu.Unlock()
		}
		close(j.done)
	}
}

// sent logs buf, just sent as (stream, step, seq), whose send slot is *slot
// (s.act[m] or s.grad[m]): at once (sync), or at the next bubble.
func (s *sendLog) sent(slot **logJob, stream string, step int64, seq int, buf []float32) error {
	s.bytes += int64(len(buf)) * 4
	if !s.bubble {
		return s.log.Append(stream, step, seq, buf)
	}
	if *slot != nil {
		// The trainer fences a slot before it rewrites the buffer.
		return fmt.Errorf("message log: %s step %d seq %d: its send buffer was rewritten before the previous copy was fenced", stream, step, seq)
	}
	j := &logJob{stream: stream, step: step, seq: seq, buf: buf, done: make(chan struct{})}
	*slot = j
	s.held = append(s.held, j)
	return nil
}

// release hands the first n held jobs to the worker, in the order they
// were sent; inBubble says whether the rank is about to wait for a message
// (else: a fence forced them).
func (s *sendLog) release(n int, inBubble bool) {
	for _, j := range s.held[:n] {
		b := int64(len(j.buf)) * 4
		if inBubble {
			s.bubbleBytes += b
		} else {
			s.forcedBytes += b
		}
		s.jobs <- j
	}
	s.held = append(s.held[:0], s.held[n:]...)
}

// bubbleStart is called before the rank waits for a message.
func (s *sendLog) bubbleStart() {
	if s.bubble && len(s.held) > 0 {
		s.release(len(s.held), true)
	}
}

// fence waits until *slot's buffer is in the log, so that the trainer may
// write it, and clears the slot. A job still held is released here, with
// the ones sent before it.
func (s *sendLog) fence(slot **logJob) error {
	j := *slot
	if j == nil {
		return nil
	}
	*slot = nil
	if i := slices.Index(s.held, j); i >= 0 {
		s.release(i+1, false)
	}
	<-j.done
	return j.err
}

// drain logs everything sent so far and returns the first error: at the
// end of training, and when it fails (SWIFT flushes its logging queue when
// a failure is detected).
func (s *sendLog) drain() error {
	if !s.bubble {
		return nil
	}
	var first error
	for _, slots := range [][]*logJob{s.act, s.grad} {
		for i := range slots {
			if err := s.fence(&slots[i]); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// check returns the worker's first error, without waiting.
func (s *sendLog) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// close drains and stops the worker.
func (s *sendLog) close() error {
	err := s.drain()
	if s.bubble {
		close(s.jobs)
		<-s.exited
	}
	return err
}
