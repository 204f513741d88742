// Package gpuhealth watches the node's NVIDIA GPUs through NVML
// (github.com/NVIDIA/go-nvml) and says whether the node is failing: a
// critical XID that means a hardware or driver fault (xid.go), a
// double-bit (uncorrectable) ECC error, a lost GPU, or GPU memory repairs
// that wait for a reset. Without the NVML library (no NVIDIA driver) the
// monitor is off and says why, once.
//
// go-nvml loads libnvidia-ml.so.1 with dlopen through cgo; only this
// package imports it, so the rest of the agent stays pure Go.
package gpuhealth

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// States of the node and of a device.
const (
	StateStarting  = "starting"  // NVML not initialized yet
	StateOK        = "ok"        // watched, nothing wrong seen
	StateFailing   = "failing"   // a node failure was seen (Reason)
	StateOff       = "off"       // not watched (Reason)
	StateUnwatched = "unwatched" // a device without events: polled only
)

// DefaultInterval bounds each wait for NVML events and spaces the polls.
const DefaultInterval = 5 * time.Second

// Events registered on every device, as far as it supports them.
// Single-bit ECC errors are corrected; they are only counted.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// Status is the node's GPU health.
type Status struct {
	State   string
	Reason  string // why off or failing; for ok, devices that are only polled
	Devices []Device
}

// Device is one GPU's health.
type Device struct {
	Index        int
	UUID         string
	State        string // ok, failing or unwatched
	Reason       string
	XID          uint64    // the XID that made it fail; 0: none
	Since        time.Time // when it started failing
	SingleBitECC uint64    // corrected ECC events seen
}

// Options configure a Monitor.
type Options struct {
	Lib      nvml.Interface // nil: the node's NVML (nvml.New())
	Log      zerolog.Logger
	Interval time.Duration // 0: DefaultInterval
}

// Monitor watches the GPUs in a goroutine (Start); Status is safe to call
// from any goroutine. Only the monitor's goroutine calls NVML.
type Monitor struct {
	lib      nvml.Interface
	log      zerolog.Logger
	interval time.Duration
	done     chan struct{}

	health

	// Owned by the monitor's goroutine.
	devs       []*device
	set        nvml.EventSet // nil: no device delivers events
	lastPoll   time.Time
	waitWarned map[nvml.Return]bool
}

// health is the node's GPU health as the monitor found it: the
// monitor's goroutine writes it (fail, update, and under mu directly),
// Status reads a copy from any goroutine. mu guards st and nodeFail; no
// method calls NVML or blocks but on mu, and fail logs after releasing it.
type health struct {
	log      zerolog.Logger
	mu       sync.Mutex
	st       Status
	nodeFail string // a failure NVML could not tie to a device
}

type device struct {
	h                 nvml.Device // nil: no handle, nothing to ask
	noRetired, noRows bool        // the query is unsupported or broken: stop asking
}

// Start initializes NVML and watches the GPUs until ctx ends, all in the
// background: it never delays or fails the agent's start.
func Start(ctx context.Context, o Options) *Monitor {
	m := newMonitor(o)
	go m.run(ctx)
	return m
}

func newMonitor(o Options) *Monitor {
	if o.Lib == nil {
		o.Lib = nvml.New()
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	return &Monitor{lib: o.Lib, log: o.Log, interval: o.Interval, done: make(chan struct{}),
		health: health{log: o.Log, st: Status{State: StateStarting}}, waitWarned: map[nvml.Return]bool{}}
}

// Done is closed when the monitor has stopped: off, or ctx ended.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Status returns a copy of the current health.
func (h *health) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.st
	st.Devices = append([]Device(nil), h.st.Devices...)
	return st
}

func (m *Monitor) run(ctx context.Context) {
	defer close(m.done)
	if !m.init() {
		return
	}
	defer m.shutdown()
	m.poll()
	for ctx.Err() == nil {
		m.step(ctx)
	}
}

// off turns the monitor off, said once in the log.
func (m *Monitor) off(reason string) {
	m.mu.Lock()
	m.st = Status{State: StateOff, Reason: reason}
	m.mu.Unlock()
	m.log.Info().Str("event", "gpu_health_off").Msg("GPU health off: " + reason)
}

func initReason(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this node"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to use NVML"
	}
	return "NVML init failed: " + ret.Error()
}

// init starts NVML and registers every device's events; false: off.
func (m *Monitor) init() bool {
	if ret := m.lib.Init(); ret != nvml.SUCCESS {
		m.off(initReason(ret))
		return false
	}
	n, ret := m.lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		m.lib.Shutdown()
		if ret != nvml.SUCCESS {
			m.off("NVML cannot count the GPUs: " + ret.Error())
		} else {
			m.off("NVML found no GPUs on this node")
		}
		return false
	}
	set, ret := m.lib.EventSetCreate()
	var noSet string
	if ret != nvml.SUCCESS {
		set, noSet = nil, "creating an NVML event set: "+ret.Error()
	}
	devs := make([]Device, n)
	registered := 0
	for i := range n {
		d, dev := m.initDevice(i, set, noSet)
		devs[i] = d
		m.devs = append(m.devs, dev)
		if d.State == StateUnwatched {
			m.log.Warn().Str("event", "gpu_unwatched").Int("gpu", i).Str("uuid", d.UUID).
				Msg("GPU health: no events from this GPU, polled only: " + d.Reason)
		}
		if d.State == StateOK {
			registered++
		}
	}
	if registered == 0 && set != nil {
		set.Free()
		set = nil
	}
	m.set = set
	m.mu.Lock()
	m.st.Devices = devs
	m.mu.Unlock()
	for i, d := range devs {
		if d.State == StateFailing {
			m.fail(i, 0, d.Reason)
		}
	}
	m.update()
	m.log.Info().Str("event", "gpu_health_on").Int("gpus", n).Int("watched", registered).
		Msg("GPU health: watching NVML events")
	return true
}

// initDevice gets device i's handle and registers its events on set.
func (m *Monitor) initDevice(i int, set nvml.EventSet, noSet string) (Device, *device) {
	d := Device{Index: i, State: StateOK}
	h, ret := m.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		d.State, d.Reason = StateUnwatched, "no NVML handle: "+ret.Error()
		if ret == nvml.ERROR_GPU_IS_LOST {
			d.State, d.Reason = StateFailing, lostReason
		}
		return d, &device{}
	}
	if uuid, ret := h.GetUUID(); ret == nvml.SUCCESS {
		d.UUID = uuid
	}
	dev := &device{h: h}
	if set == nil {
		d.State, d.Reason = StateUnwatched, noSet
		return d, dev
	}
	supported, ret := h.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		d.State, d.Reason = StateUnwatched, "reading the supported event types: "+ret.Error()
		return d, dev
	}
	mask := watchedEvents & supported
	if mask&(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError) == 0 {
		d.State, d.Reason = StateUnwatched, "supports neither XID nor double-bit ECC events"
		return d, dev
	}
	if ret := h.RegisterEvents(mask, set); ret != nvml.SUCCESS {
		d.State, d.Reason = StateUnwatched, "registering events: "+ret.Error()
	}
	return d, dev
}

func (m *Monitor) shutdown() {
	if m.set != nil {
		m.set.Free()
	}
	m.lib.Shutdown()
}

// step waits for one event (at most an interval) and polls when due.
func (m *Monitor) step(ctx context.Context) {
	if m.set == nil {
		m.sleep(ctx)
	} else {
		e, ret := m.set.Wait(uint32(m.interval / time.Millisecond))
		switch ret {
		case nvml.SUCCESS:
			m.event(e)
		case nvml.ERROR_TIMEOUT:
		default:
			// ERROR_GPU_IS_LOST among others: the poll finds which GPU.
			if !m.waitWarned[ret] {
				m.waitWarned[ret] = true
				m.log.Warn().Str("event", "gpu_wait_error").Msg("GPU health: waiting for NVML events: " + ret.Error())
			}
			m.sleep(ctx) // do not spin on a broken event set
		}
	}
	if ctx.Err() == nil && time.Since(m.lastPoll) >= m.interval {
		m.poll()
	}
}

func (m *Monitor) sleep(ctx context.Context) {
	t := time.NewTimer(m.interval)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// event handles one NVML event.
func (m *Monitor) event(e nvml.EventData) {
	i := m.deviceOf(e.Device)
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		xid := e.EventData
		if why, ok := failingXIDs[xid]; ok {
			m.fail(i, xid, fmt.Sprintf("XID %d: %s", xid, why))
		} else if why, ok := appXIDs[xid]; ok {
			m.log.Info().Str("event", "gpu_xid").Int("gpu", i).Uint64("xid", xid).
				Msg("GPU XID " + fmt.Sprint(xid) + ": " + why + "; not a node failure")
		} else {
			m.log.Warn().Str("event", "gpu_xid").Int("gpu", i).Uint64("xid", xid).
				Msgf("GPU XID %d is not in reft's table of node failures (agent/gpuhealth/xid.go); not treated as failing", xid)
		}
	case nvml.EventTypeDoubleBitEccError:
		m.fail(i, 0, "double-bit (uncorrectable) ECC error")
	case nvml.EventTypeSingleBitEccError:
		m.mu.Lock()
		first := false
		if i >= 0 && i < len(m.st.Devices) {
			m.st.Devices[i].SingleBitECC++
			first = m.st.Devices[i].SingleBitECC == 1
		}
		m.mu.Unlock()
		if first {
			m.log.Info().Str("event", "gpu_ecc_corrected").Int("gpu", i).
				Msg("GPU single-bit ECC error (corrected); counted in the status, not a node failure")
		}
	}
}

// deviceOf is the index of the device an event names; -1: unknown.
func (m *Monitor) deviceOf(h nvml.Device) int {
	if h == nil {
		return -1
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return -1
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, d := range m.st.Devices {
		if d.UUID != "" && d.UUID == uuid {
			return i
		}
	}
	return -1
}

const lostReason = "GPU is lost: fallen off the bus or otherwise inaccessible"

// poll asks every device for the memory repairs that wait for a reset,
// which NVML reports as state rather than as events. A query a device
// does not support is not asked again.
func (m *Monitor) poll() {
	m.lastPoll = time.Now()
	for i, dev := range m.devs {
		if dev.h == nil || m.deviceFailing(i) {
			continue
		}
		if !dev.noRetired {
			st, ret := dev.h.GetRetiredPagesPendingStatus()
			reason, stop := retiredPagesVerdict(st, ret)
			if stop {
				dev.noRetired = true
				m.unpolled(i, ret, "retired pages")
			}
			if reason != "" {
				m.fail(i, 0, reason)
				continue
			}
		}
		if !dev.noRows {
			_, _, pending, failed, ret := dev.h.GetRemappedRows()
			reason, stop := remappedRowsVerdict(pending, failed, ret)
			if stop {
				dev.noRows = true
				m.unpolled(i, ret, "remapped rows")
			}
			if reason != "" {
				m.fail(i, 0, reason)
			}
		}
	}
}

// retiredPagesVerdict reads a retired-pages query: why the device is
// failing ("" when it is not), and whether to stop asking (the query
// failed otherwise than by losing the GPU).
func retiredPagesVerdict(st nvml.EnableState, ret nvml.Return) (reason string, stop bool) {
	switch {
	case ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED:
		return "GPU memory pages are pending retirement after ECC errors; the GPU needs a reset", false
	case ret == nvml.ERROR_GPU_IS_LOST:
		return lostReason, false
	case ret != nvml.SUCCESS:
		return "", true
	}
	return "", false
}

// remappedRowsVerdict reads a remapped-rows query as retiredPagesVerdict
// does.
func remappedRowsVerdict(pending, failed bool, ret nvml.Return) (reason string, stop bool) {
	switch {
	case ret == nvml.SUCCESS && failed:
		return "GPU memory row remapping failed", false
	case ret == nvml.SUCCESS && pending:
		return "GPU memory row remapping is pending after an uncorrectable ECC error; the GPU needs a reset", false
	case ret == nvml.ERROR_GPU_IS_LOST:
		return lostReason, false
	case ret != nvml.SUCCESS:
		return "", true
	}
	return "", false
}

// unpolled says why a query is not asked again, unless the GPU simply
// lacks the feature (retired pages before Ampere, remapped rows since).
func (m *Monitor) unpolled(i int, ret nvml.Return, what string) {
	if ret != nvml.ERROR_NOT_SUPPORTED {
		m.log.Warn().Str("event", "gpu_poll_error").Int("gpu", i).
			Msgf("GPU health: reading %s: %s; no longer asked", what, ret.Error())
	}
}

func (h *health) deviceFailing(i int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st.Devices[i].State == StateFailing
}

// fail marks device i (-1: a device NVML did not name) failing and logs
// gpu_failing, once per device: the first cause is the one that counts.
func (h *health) fail(i int, xid uint64, reason string) {
	h.mu.Lock()
	var uuid string
	if i >= 0 && i < len(h.st.Devices) {
		d := &h.st.Devices[i]
		if d.State == StateFailing && !d.Since.IsZero() { // zero Since: found failing by init, not logged yet
			h.mu.Unlock()
			return
		}
		d.State, d.Reason, d.XID, d.Since = StateFailing, reason, xid, time.Now()
		uuid = d.UUID
	} else {
		if h.nodeFail != "" {
			h.mu.Unlock()
			return
		}
		i, h.nodeFail = -1, "a GPU NVML could not name: "+reason
	}
	h.mu.Unlock()
	h.update()
	ev := h.log.Error().Str("event", "gpu_failing").Int("gpu", i).Str("uuid", uuid).Str("reason", reason)
	if xid != 0 {
		ev = ev.Uint64("xid", xid)
	}
	ev.Msg("GPU failing: " + reason)
}

// update derives the node's state from its devices.
func (h *health) update() {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, reason, polled := StateOK, h.nodeFail, ""
	if h.nodeFail != "" {
		st = StateFailing
	}
	for _, d := range h.st.Devices {
		switch d.State {
		case StateFailing:
			if st != StateFailing {
				st, reason = StateFailing, deviceName(d)+": "+d.Reason
			}
		case StateUnwatched:
			if polled == "" {
				polled = deviceName(d) + " is polled only: " + d.Reason
			}
		}
	}
	if st == StateOK {
		reason = polled
	}
	h.st.State, h.st.Reason = st, reason
}

func deviceName(d Device) string {
	if d.UUID == "" {
		return fmt.Sprintf("GPU %d", d.Index)
	}
	return fmt.Sprintf("GPU %d (%s)", d.Index, d.UUID)
}
