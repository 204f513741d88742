package gpuhealth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/reft-hpc/reft/agent/logging/logtest"
	"github.com/rs/zerolog"
)

// gpu describes one mock device.
type gpu struct {
	uuid      string
	supported uint64      // event types; 0: watchedEvents
	register  nvml.Return // RegisterEvents' answer
	retired   nvml.EnableState
	retRet    nvml.Return // GetRetiredPagesPendingStatus' answer
	pending   bool        // remapping pending
	rowsRet   nvml.Return
}

// fakeNVML is go-nvml's mock wired to gpus; events feeds EventSet.Wait.
type fakeNVML struct {
	lib    *mock.Interface
	devs   []*mock.Device
	set    *mock.EventSet
	events chan nvml.EventData
}

func newFake(gpus ...gpu) *fakeNVML {
	f := &fakeNVML{events: make(chan nvml.EventData, 16)}
	for _, g := range gpus {
		d := &mock.Device{
			GetUUIDFunc: func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS },
			GetSupportedEventTypesFunc: func() (uint64, nvml.Return) {
				if g.supported == 0 {
					return watchedEvents, nvml.SUCCESS
				}
				return g.supported, nvml.SUCCESS
			},
			RegisterEventsFunc:               func(uint64, nvml.EventSet) nvml.Return { return g.register },
			GetRetiredPagesPendingStatusFunc: func() (nvml.EnableState, nvml.Return) { return g.retired, g.retRet },
			GetRemappedRowsFunc:              func() (int, int, bool, bool, nvml.Return) { return 0, 0, g.pending, false, g.rowsRet },
		}
		f.devs = append(f.devs, d)
	}
	f.set = &mock.EventSet{
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			t := time.NewTimer(time.Duration(ms) * time.Millisecond)
			defer t.Stop()
			select {
			case e := <-f.events:
				return e, nvml.SUCCESS
			case <-t.C:
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
	}
	f.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(f.devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(f.devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return f.devs[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return f.set, nvml.SUCCESS },
	}
	return f
}

// logBuf collects the monitor's log lines; the monitor writes from its goroutine.
type logBuf struct{ logtest.Buffer }

// count is how many log lines carry event ev.
func (l *logBuf) count(ev string) int { return len(l.Events(ev)) }

func twoGPUs() []gpu { return []gpu{{uuid: "GPU-aaa"}, {uuid: "GPU-bbb"}} }

// started is a monitor over f, initialized and polled, as run leaves it
// before its event loop.
func started(t *testing.T, f *fakeNVML) (*Monitor, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	m := newMonitor(Options{Lib: f.lib, Log: zerolog.New(lb), Interval: time.Millisecond})
	if !m.init() {
		t.Fatalf("init turned the monitor off: %+v\n%s", m.Status(), lb)
	}
	m.poll()
	return m, lb
}

func TestOff(t *testing.T) {
	tests := []struct {
		name string
		fix  func(f *fakeNVML)
		want string
	}{
		{"library absent", func(f *fakeNVML) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND } },
			"libnvidia-ml.so.1 not found"},
		{"driver not loaded", func(f *fakeNVML) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED } },
			"driver is not loaded"},
		{"init fails", func(f *fakeNVML) { f.lib.InitFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN } },
			"NVML init failed: ERROR_UNKNOWN"},
		{"no devices", func(f *fakeNVML) { f.devs = nil }, "NVML found no GPUs"},
		{"count fails", func(f *fakeNVML) {
			f.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		}, "cannot count the GPUs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(twoGPUs()...)
			tt.fix(f)
			lb := &logBuf{}
			m := Start(context.Background(), Options{Lib: f.lib, Log: zerolog.New(lb)})
			<-m.Done() // off stops the monitor by itself
			st := m.Status()
			if st.State != StateOff || !strings.Contains(st.Reason, tt.want) {
				t.Fatalf("status %+v, want off with %q", st, tt.want)
			}
			if n := lb.count("gpu_health_off"); n != 1 || strings.Count(lb.String(), "\n") != 1 {
				t.Fatalf("want exactly one gpu_health_off line, got:\n%s", lb)
			}
			if !strings.Contains(lb.String(), `"level":"info"`) {
				t.Fatalf("off is not an error; got:\n%s", lb)
			}
			inited := len(f.lib.InitCalls()) > 0 && f.lib.InitFunc() == nvml.SUCCESS
			if inited && len(f.lib.ShutdownCalls()) != 1 {
				t.Fatalf("NVML initialized but not shut down")
			}
		})
	}
}

func TestEvents(t *testing.T) {
	dev := func(f *fakeNVML, i int) nvml.Device { return f.devs[i] }
	tests := []struct {
		name    string
		events  func(f *fakeNVML) []nvml.EventData
		state   string
		failDev int    // index of the failing device; -1: none
		xid     uint64 // of the failing device
		reason  string // in the node's reason
	}{
		{"healthy", func(*fakeNVML) []nvml.EventData { return nil }, StateOK, -1, 0, ""},
		{"critical xid on device 1", func(f *fakeNVML) []nvml.EventData {
			return []nvml.EventData{{Device: dev(f, 1), EventType: nvml.EventTypeXidCriticalError, EventData: 79}}
		}, StateFailing, 1, 79, "GPU 1 (GPU-bbb): XID 79: GPU has fallen off the bus"},
		{"application xid", func(f *fakeNVML) []nvml.EventData {
			return []nvml.EventData{
				{Device: dev(f, 0), EventType: nvml.EventTypeXidCriticalError, EventData: 13},
				{Device: dev(f, 1), EventType: nvml.EventTypeXidCriticalError, EventData: 31},
				{Device: dev(f, 1), EventType: nvml.EventTypeXidCriticalError, EventData: 43},
			}
		}, StateOK, -1, 0, ""},
		{"unknown xid", func(f *fakeNVML) []nvml.EventData {
			return []nvml.EventData{{Device: dev(f, 0), EventType: nvml.EventTypeXidCriticalError, EventData: 9999}}
		}, StateOK, -1, 0, ""},
		{"double-bit ecc", func(f *fakeNVML) []nvml.EventData {
			return []nvml.EventData{{Device: dev(f, 0), EventType: nvml.EventTypeDoubleBitEccError}}
		}, StateFailing, 0, 0, "GPU 0 (GPU-aaa): double-bit (uncorrectable) ECC error"},
		{"single-bit ecc", func(f *fakeNVML) []nvml.EventData {
			e := nvml.EventData{Device: dev(f, 1), EventType: nvml.EventTypeSingleBitEccError}
			return []nvml.EventData{e, e}
		}, StateOK, -1, 0, ""},
		{"first cause counts", func(f *fakeNVML) []nvml.EventData {
			return []nvml.EventData{
				{Device: dev(f, 1), EventType: nvml.EventTypeXidCriticalError, EventData: 48},
				{Device: dev(f, 1), EventType: nvml.EventTypeDoubleBitEccError},
				{Device: dev(f, 1), EventType: nvml.EventTypeXidCriticalError, EventData: 48},
			}
		}, StateFailing, 1, 48, "XID 48: double-bit ECC error"},
		{"device not named", func(*fakeNVML) []nvml.EventData {
			return []nvml.EventData{{EventType: nvml.EventTypeXidCriticalError, EventData: 95}}
		}, StateFailing, -1, 0, "a GPU NVML could not name: XID 95"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake(twoGPUs()...)
			m, lb := started(t, f)
			for _, e := range tt.events(f) {
				m.event(e)
			}
			st := m.Status()
			if st.State != tt.state || !strings.Contains(st.Reason, tt.reason) {
				t.Fatalf("status %+v, want %s with %q", st, tt.state, tt.reason)
			}
			if len(st.Devices) != 2 {
				t.Fatalf("devices %+v", st.Devices)
			}
			for i, d := range st.Devices {
				want := StateOK
				if i == tt.failDev {
					want = StateFailing
					if d.XID != tt.xid || d.Since.IsZero() || d.Reason == "" {
						t.Fatalf("device %d: %+v, want xid %d, a time and a reason", i, d, tt.xid)
					}
				}
				if d.State != want {
					t.Fatalf("device %d: %+v, want %s", i, d, want)
				}
			}
			wantLogs := 0
			if tt.state == StateFailing {
				wantLogs = 1 // once per device, whatever follows
			}
			if n := lb.count("gpu_failing"); n != wantLogs {
				t.Fatalf("%d gpu_failing lines, want %d:\n%s", n, wantLogs, lb)
			}
		})
	}
}

func TestSingleBitCounted(t *testing.T) {
	f := newFake(twoGPUs()...)
	m, lb := started(t, f)
	e := nvml.EventData{Device: f.devs[1], EventType: nvml.EventTypeSingleBitEccError}
	m.event(e)
	m.event(e)
	if d := m.Status().Devices[1]; d.SingleBitECC != 2 || d.State != StateOK {
		t.Fatalf("device 1: %+v, want ok with 2 corrected errors", d)
	}
	if n := lb.count("gpu_ecc_corrected"); n != 1 {
		t.Fatalf("%d gpu_ecc_corrected lines, want 1", n)
	}
}

func TestRegistrationUnsupported(t *testing.T) {
	gpus := []gpu{{uuid: "GPU-aaa"}, {uuid: "GPU-bbb", register: nvml.ERROR_NOT_SUPPORTED}, {uuid: "GPU-ccc"}}
	f := newFake(gpus...)
	m, lb := started(t, f)
	st := m.Status()
	if st.State != StateOK || st.Devices[1].State != StateUnwatched || !strings.Contains(st.Reason, "GPU 1 (GPU-bbb) is polled only") {
		t.Fatalf("status %+v, want ok with GPU 1 unwatched", st)
	}
	if n := lb.count("gpu_unwatched"); n != 1 || strings.Count(lb.String(), `"level":"warn"`) != 1 {
		t.Fatalf("want one warning:\n%s", lb)
	}
	m.event(nvml.EventData{Device: f.devs[2], EventType: nvml.EventTypeXidCriticalError, EventData: 74})
	if st := m.Status(); st.State != StateFailing || st.Devices[2].State != StateFailing || st.Devices[2].XID != 74 {
		t.Fatalf("the other devices are still watched: status %+v", st)
	}
}

func TestNoEventTypes(t *testing.T) {
	// A device that supports only clock events cannot report a failure.
	f := newFake(gpu{uuid: "GPU-aaa", supported: nvml.EventTypeClock})
	m, _ := started(t, f)
	if st := m.Status(); st.State != StateOK || st.Devices[0].State != StateUnwatched {
		t.Fatalf("status %+v", st)
	}
	if m.set != nil || len(f.set.FreeCalls()) != 1 {
		t.Fatalf("an event set without devices is freed and not waited on")
	}
}

func TestPoll(t *testing.T) {
	tests := []struct {
		name   string
		g      gpu
		state  string
		reason string
		warns  int
	}{
		{"healthy", gpu{}, StateOK, "", 0},
		{"remap pending", gpu{pending: true}, StateFailing, "row remapping is pending", 0},
		{"pages pending retirement", gpu{retired: nvml.FEATURE_ENABLED}, StateFailing, "pending retirement", 0},
		{"lost", gpu{rowsRet: nvml.ERROR_GPU_IS_LOST, retRet: nvml.ERROR_NOT_SUPPORTED}, StateFailing, "GPU is lost", 0},
		{"unsupported", gpu{rowsRet: nvml.ERROR_NOT_SUPPORTED, retRet: nvml.ERROR_NOT_SUPPORTED}, StateOK, "", 0},
		{"broken query", gpu{rowsRet: nvml.ERROR_UNKNOWN}, StateOK, "", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.g.uuid = "GPU-x"
			f := newFake(tt.g)
			m, lb := started(t, f)
			m.poll()
			m.poll()
			st := m.Status()
			if st.State != tt.state || !strings.Contains(st.Reason, tt.reason) {
				t.Fatalf("status %+v, want %s with %q", st, tt.state, tt.reason)
			}
			if n := strings.Count(lb.String(), `"level":"warn"`); n != tt.warns {
				t.Fatalf("%d warnings, want %d:\n%s", n, tt.warns, lb)
			}
			if tt.state == StateFailing && lb.count("gpu_failing") != 1 {
				t.Fatalf("want one gpu_failing line:\n%s", lb)
			}
			// A query that failed is not asked again; a failing device not at all.
			if tt.g.rowsRet != nvml.SUCCESS || tt.state == StateFailing {
				if n := len(f.devs[0].GetRemappedRowsCalls()); n > 1 {
					t.Fatalf("remapped rows asked %d times, want at most 1", n)
				}
			}
		})
	}
}

func TestStartWatchesUntilCancel(t *testing.T) {
	f := newFake(twoGPUs()...)
	lb := &logBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	m := Start(ctx, Options{Lib: f.lib, Log: zerolog.New(lb), Interval: 10 * time.Millisecond})
	f.events <- nvml.EventData{Device: f.devs[1], EventType: nvml.EventTypeXidCriticalError, EventData: 48}
	for m.Status().State != StateFailing {
		select {
		case <-m.Done():
			t.Fatalf("monitor stopped: %+v\n%s", m.Status(), lb)
		case <-time.After(time.Millisecond):
		}
	}
	if d := m.Status().Devices[1]; d.State != StateFailing || d.XID != 48 || d.UUID != "GPU-bbb" {
		t.Fatalf("device 1: %+v", d)
	}
	cancel()
	<-m.Done()
	if len(f.lib.ShutdownCalls()) != 1 || len(f.set.FreeCalls()) != 1 {
		t.Fatalf("NVML not released: %d shutdowns, %d frees", len(f.lib.ShutdownCalls()), len(f.set.FreeCalls()))
	}
}

func TestWaitErrorWarnsOnce(t *testing.T) {
	f := newFake(twoGPUs()...)
	f.set.WaitFunc = func(uint32) (nvml.EventData, nvml.Return) { return nvml.EventData{}, nvml.ERROR_UNKNOWN }
	m, lb := started(t, f)
	ctx := context.Background()
	m.step(ctx)
	m.step(ctx)
	if n := lb.count("gpu_wait_error"); n != 1 {
		t.Fatalf("%d gpu_wait_error lines, want 1:\n%s", n, lb)
	}
	if st := m.Status(); st.State != StateOK {
		t.Fatalf("status %+v", st)
	}
}

// TestRealNVML runs the node's own NVML: without the NVIDIA driver (as on
// build machines) the monitor is off with the reason, and nothing crashes.
func TestRealNVML(t *testing.T) {
	lb := &logBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := Start(ctx, Options{Log: zerolog.New(lb), Interval: 10 * time.Millisecond})
	for m.Status().State == StateStarting {
		select {
		case <-m.Done():
		case <-time.After(time.Millisecond):
		}
	}
	st := m.Status()
	t.Logf("status %+v", st)
	switch st.State {
	case StateOff:
		if st.Reason == "" || lb.count("gpu_health_off") != 1 {
			t.Fatalf("off without its one reason: %+v\n%s", st, lb)
		}
	case StateOK, StateFailing:
		if len(st.Devices) == 0 {
			t.Fatalf("watching no devices: %+v", st)
		}
	default:
		t.Fatalf("state %q", st.State)
	}
	cancel()
	<-m.Done()
}
