package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is returned when a /proc field or a metric is absent.
var ErrNotFound = errors.New("not found")

// ReadVmRSS returns the resident set size of process pid in bytes.
func ReadVmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read rss: %w", err)
	}
	defer f.Close()
	return parseVmRSS(f)
}

// parseVmRSS reads the VmRSS line of a /proc/PID/status file, which the
// kernel reports in kB (KiB).
func parseVmRSS(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("parse rss: unexpected line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse rss: %w", err)
		}
		return kb * 1024, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("parse rss: %w", err)
	}
	return 0, fmt.Errorf("parse rss: VmRSS: %w", ErrNotFound)
}

// Metrics is one scrape of a Prometheus text exposition: every sample's
// value summed per metric name across its label sets.
type Metrics map[string]float64

// Get returns the value of name, and whether the scrape had it.
func (m Metrics) Get(name string) (float64, bool) {
	v, ok := m[name]
	return v, ok
}

// ScrapeMetrics fetches and parses url (a node's /metrics).
func ScrapeMetrics(ctx context.Context, client *http.Client, url string) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape metrics: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format. Only what the benchmarks
// need is kept: labels are dropped and same-named samples summed, so a
// counter vector reads as its total; a histogram's buckets are kept by
// their upper bound as well (Metrics.Bucket).
func parseMetrics(r io.Reader) (Metrics, error) {
	m := Metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		le := ""
		if strings.HasPrefix(rest, "{") {
			// Label values may hold spaces and braces only inside quotes,
			// and '}' cannot appear unquoted, so the last '}' ends them.
			j := strings.LastIndexByte(rest, '}')
			if j < 0 {
				return nil, fmt.Errorf("parse metrics: unterminated labels in %q", line)
			}
			le = leLabel(rest[1:j])
			rest = rest[j+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("parse metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("parse metrics: %q: %w", line, err)
		}
		m[name] += v
		if le != "" && strings.HasSuffix(name, "_bucket") {
			m[bucketKey(strings.TrimSuffix(name, "_bucket"), le)] += v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return m, nil
}

// leLabel is the value of the label le in labels (`a="x",le="0.5"`), or "".
func leLabel(labels string) string {
	for labels != "" {
		i := strings.IndexByte(labels, '=')
		if i < 0 || i+1 >= len(labels) || labels[i+1] != '"' {
			return ""
		}
		key := strings.TrimSpace(strings.TrimPrefix(labels[:i], ","))
		v, rest, ok := quotedValue(labels[i+1:])
		if !ok {
			return ""
		}
		if key == "le" {
			return v
		}
		labels = rest
	}
	return ""
}

// quotedValue splits `"v\"x",rest` into v\"x and ,rest.
func quotedValue(s string) (v, rest string, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return s[1:i], s[i+1:], true
		}
	}
	return "", "", false
}

func bucketKey(histogram, le string) string { return histogram + `_bucket{le="` + le + `"}` }

// Bucket returns the count of histogram's bucket le (its upper bound as
// the exposition writes it: "0.5", "+Inf"), summed over the other labels.
func (m Metrics) Bucket(histogram, le string) (float64, bool) {
	v, ok := m[bucketKey(histogram, le)]
	return v, ok
}

// clockTicks is the unit of utime and stime in /proc/PID/stat (USER_HZ).
// Linux fixes it at 100 on every architecture Go supports.
const clockTicks = 100

// ReadCPUTime returns the CPU time, user plus system, that process pid and
// all its threads have used so far (10 ms resolution).
func ReadCPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read cpu time: %w", err)
	}
	return parseCPUTime(string(b))
}

// parseCPUTime reads utime and stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may itself hold
// spaces and parentheses, so fields are counted after its last ')'.
func parseCPUTime(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse cpu time: no command name in %.80q", stat)
	}
	// After ')': field 3 (state) is the first.
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("parse cpu time: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("parse cpu time: bad tick count %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
