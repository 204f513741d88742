// Package metrics_test runs reft's Prometheus export end to end on one
// machine: a real agent (agenttest) with a client saving steps, the
// agent's textfile loop (agent/metrics), Debian's prometheus-node-exporter
// reading the directory with its textfile collector, scraped over
// loopback, and promtool checking the scrape. `make deps` installs both
// programs. The same on the Slurm test cluster (a node lost mid-run, the
// failure counter moving) is issue 22's cluster e2e, still to come.
package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/reft-hpc/reft/agent/metrics"
	"github.com/reft-hpc/reft/client"
	"github.com/reft-hpc/reft/tests/conformance-agent/agenttest"
)

// need is the path of a program `make deps` installs.
func need(t *testing.T, prog string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err != nil {
		t.Fatalf("%s not found: make deps installs it (Debian's prometheus-node-exporter and prometheus packages)", prog)
	}
	return p
}

// freePort is a loopback port nobody listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startNodeExporter runs node_exporter with its textfile collector alone
// on dir, until the test ends; it returns the scrape URL.
func startNodeExporter(t *testing.T, dir string) string {
	t.Helper()
	bin := need(t, "prometheus-node-exporter")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var out bytes.Buffer
	cmd := exec.Command(bin, "--collector.disable-defaults", "--collector.textfile",
		"--collector.textfile.directory="+dir, "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("node_exporter's output:\n%s", out.String())
		}
	})
	url := "http://" + addr + "/metrics"
	eventually(t, 20*time.Second, "node_exporter answers", func() error {
		_, err := scrape(url)
		return err
	})
	return url
}

func scrape(url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	// Text format: what promtool reads, whatever the client negotiates.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// eventually polls f until it returns nil: node_exporter and the agent's
// loop are other processes and goroutines on real time, which synctest
// cannot fake.
func eventually(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not after %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func families(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// value is the value of name's sample whose labels include want.
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
next:
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestNodeExporterScrapesAgent(t *testing.T) {
	promtool := need(t, "promtool")
	dir := t.TempDir()
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil { // as an admin makes it
		t.Fatal(err)
	}
	url := startNodeExporter(t, dir)

	const job = "4242"
	a, err := agenttest.Start(agenttest.Options{Job: job, Spec: "arc"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	node := a.Status().Node
	tf, err := metrics.OpenTextfile(dir, job, node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		metrics.Run(ctx, tf, a.Status, 100*time.Millisecond, zerolog.Nop())
	}()
	defer func() { stop(); <-loopDone }()

	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Open(cctx, client.Options{Socket: a.Socket, Layout: "dp=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	if err := c.Register("w", buf, client.Kind(0)); err != nil {
		t.Fatal(err)
	}
	save := func(step int64) {
		t.Helper()
		buf[0] = byte(step)
		if err := c.Save(step).Wait(cctx); err != nil {
			t.Fatalf("save %d: %v", step, err)
		}
	}
	labels := map[string]string{"job_id": job, "node": node, "rank": "0"}
	// scrapeAt waits until node_exporter serves committed step want.
	scrapeAt := func(want float64) (map[string]*dto.MetricFamily, []byte) {
		t.Helper()
		var mfs map[string]*dto.MetricFamily
		var body []byte
		eventually(t, 20*time.Second, fmt.Sprintf("scrape with reft_committed_step %v", want), func() error {
			b, err := scrape(url)
			if err != nil {
				return err
			}
			if mfs, err = families(b); err != nil {
				return err
			}
			body = b
			if v, ok := value(mfs, "reft_committed_step", labels); !ok || v != want {
				return fmt.Errorf("reft_committed_step%v = %v (present: %v)", labels, v, ok)
			}
			return nil
		})
		return mfs, body
	}

	for step := int64(1); step <= 3; step++ {
		save(step)
	}
	mfs, body := scrapeAt(3)
	for name := range metrics.Families() {
		if mfs[name] == nil {
			t.Errorf("scrape lacks %s", name)
		}
	}
	if v, ok := value(mfs, "node_textfile_scrape_error", nil); !ok || v != 0 {
		t.Errorf("node_textfile_scrape_error = %v (present: %v), want 0", v, ok)
	}
	if v, _ := value(mfs, "reft_snapshot_duration_seconds", map[string]string{"job_id": job}); v != 3 {
		t.Errorf("reft_snapshot_duration_seconds count %v, want 3 saves", v)
	}
	if v, _ := value(mfs, "reft_snapshot_bytes", labels); v != float64(len(buf)) {
		t.Errorf("reft_snapshot_bytes %v, want %d", v, len(buf))
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = bytes.NewReader(body)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on the scrape: %v\n%s", err, out)
	}

	// The committed step advances; a restore is counted by its source.
	save(4)
	save(5)
	if _, _, err := c.Restore(cctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the restore in a scrape", func() error {
		b, err := scrape(url)
		if err != nil {
			return err
		}
		mfs, err := families(b)
		if err != nil {
			return err
		}
		if v, _ := value(mfs, "reft_committed_step", labels); v != 5 {
			return fmt.Errorf("committed step %v, want 5", v)
		}
		if v, _ := value(mfs, "reft_restore_duration_seconds", map[string]string{"source": "local"}); v != 1 {
			return fmt.Errorf("local restores %v, want 1", v)
		}
		return nil
	})

	// Stopping the agent's loop removes the file, and the job's series
	// leave node_exporter.
	stop()
	<-loopDone
	if _, err := os.Lstat(tf.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("textfile left after stop: %v", err)
	}
	eventually(t, 20*time.Second, "reft's families gone from the scrape", func() error {
		b, err := scrape(url)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "reft_committed_step{") {
			return errors.New("reft_committed_step still scraped")
		}
		return nil
	})
}
