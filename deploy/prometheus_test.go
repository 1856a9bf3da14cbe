package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/converger/edge/envoy"
	"github.com/converger/edge/shared/debpkg"
)

// The Prometheus configuration of deploy/prometheus and the Grafana dashboard of
// deploy/grafana, checked with Debian's prometheus package (the server and promtool):
// here the files themselves, in prometheus_e2e_test.go against the running programs.

const (
	prometheusDir = "prometheus"
	dashboardFile = "grafana/converger.json"
)

// The jobs the rules select, as every shipped scrape configuration names them.
var prometheusJobs = []string{"converger-sidecar", "converger-core", "envoy"}

// Where Debian's prometheus package installs its binaries.
var (
	prometheusBinary = "/usr/bin/prometheus"
	promtoolBinary   = "/usr/bin/promtool"
)

var (
	prometheusOnce sync.Once
	prometheusErr  error
)

// requirePrometheus returns once Prometheus and promtool are installed: it installs
// Debian's prometheus package when they are missing and the tests run as root (as CI
// does), and skips the test otherwise.
func requirePrometheus(t *testing.T) {
	t.Helper()
	installed := func() bool { return debpkg.IsExecutable(prometheusBinary) && debpkg.IsExecutable(promtoolBinary) }
	if installed() {
		return
	}
	if !debpkg.CanInstall() {
		t.Skipf("SKIP: the Prometheus tests need %s and %s: install Debian's prometheus package "+
			"(apt-get install prometheus), or run the tests as root, which installs it", prometheusBinary, promtoolBinary)
	}
	prometheusOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		prometheusErr = debpkg.Install(ctx, t.Logf, "prometheus")
	})
	if prometheusErr != nil {
		t.Fatal(prometheusErr)
	}
	if !installed() {
		t.Fatalf("installed the prometheus package, but %s or %s is still missing", prometheusBinary, promtoolBinary)
	}
}

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtoolBinary, args...)
	cmd.Dir = prometheusDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ruleGroups is the part of a rule file the checks read.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func readRules(t *testing.T, name string) []rule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(prometheusDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := yaml.Unmarshal(b, &g); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out []rule
	for _, grp := range g.Groups {
		out = append(out, grp.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", name)
	}
	return out
}

// scrapeConfig is the part of a Prometheus configuration the checks read.
type scrapeConfig struct {
	RuleFiles     []string `json:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `json:"job_name"`
		MetricsPath   string `json:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

func readScrapeConfig(t *testing.T, name string) scrapeConfig {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(prometheusDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var c scrapeConfig
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}

// TestPrometheusRules: promtool accepts the configurations and the rule files, the unit
// tests of the alerts pass, every alert has a test that it fires and one that it does
// not, a severity, a summary and a runbook line in docs/operations.md, and every shipped
// scrape configuration names the jobs the rules select.
func TestPrometheusRules(t *testing.T) {
	requirePrometheus(t)
	for _, c := range []string{"prometheus.yml", "prometheus-hosts.yml"} {
		promtool(t, "check", "config", c) // also checks the rule files it names
	}
	promtool(t, "check", "rules", "rules.yml", "alerts.yml")
	if out := promtool(t, "test", "rules", "tests.yml"); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: no SUCCESS in\n%s", out)
	}

	alerts := readRules(t, "alerts.yml")
	fires, quiet := alertTestCases(t)
	runbook := alertRunbook(t)
	var names []string
	for _, a := range alerts {
		if a.Alert == "" {
			t.Errorf("alerts.yml: a rule without an alert name: %+v", a)
			continue
		}
		names = append(names, a.Alert)
		if !fires[a.Alert] {
			t.Errorf("%s: tests.yml has no case where it fires", a.Alert)
		}
		if !quiet[a.Alert] {
			t.Errorf("%s: tests.yml has no case where it does not fire", a.Alert)
		}
		if s := a.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
			t.Errorf("%s: severity %q, want critical, warning or info", a.Alert, s)
		}
		if a.Annotations["summary"] == "" || a.Annotations["runbook"] != "docs/operations.md#alerts" {
			t.Errorf("%s: want a summary and runbook: docs/operations.md#alerts, got %v", a.Alert, a.Annotations)
		}
		if sev, ok := runbook[a.Alert]; !ok {
			t.Errorf("%s: no runbook line in docs/operations.md's Alerts table", a.Alert)
		} else if sev != a.Labels["severity"] {
			t.Errorf("%s: docs/operations.md says [%s], alerts.yml severity %s", a.Alert, sev, a.Labels["severity"])
		}
	}
	for name := range runbook {
		if !slices.Contains(names, name) {
			t.Errorf("docs/operations.md's Alerts table lists %s, which alerts.yml does not have", name)
		}
	}
	for name := range fires {
		if !slices.Contains(names, name) {
			t.Errorf("tests.yml tests %s, which alerts.yml does not have", name)
		}
	}

	// The unit tests can fail: with an alert's condition replaced by one that never holds,
	// its tests fail and name it. One promtool run tests a copy per alert, with that
	// alert's tests only.
	alertsFile, err := os.ReadFile(filepath.Join(prometheusDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	testsFile, err := os.ReadFile(filepath.Join(prometheusDir, "tests.yml"))
	if err != nil {
		t.Fatal(err)
	}
	mutants := t.TempDir()
	var args []string
	for _, name := range names {
		var doc map[string]any
		if err := yaml.Unmarshal(alertsFile, &doc); err != nil {
			t.Fatal(err)
		}
		for _, g := range doc["groups"].([]any) {
			for _, r := range g.(map[string]any)["rules"].([]any) {
				if r := r.(map[string]any); r["alert"] == name {
					r["expr"] = "vector(0) > 1"
				}
			}
		}
		broken, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		var tests map[string]any
		if err := yaml.Unmarshal(testsFile, &tests); err != nil {
			t.Fatal(err)
		}
		var own []any
		for _, tc := range tests["tests"].([]any) {
			for _, a := range tc.(map[string]any)["alert_rule_test"].([]any) {
				if a.(map[string]any)["alertname"] == name {
					own = append(own, tc)
					break
				}
			}
		}
		tests["tests"] = own
		ownTests, err := yaml.Marshal(tests)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(mutants, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), broken, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "tests.yml"), ownTests, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, filepath.Join(name, "tests.yml"))
	}
	cmd := exec.Command(promtoolBinary, append([]string{"test", "rules"}, args...)...)
	cmd.Dir = mutants
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("promtool test rules passes with every alert made never to fire in turn:\n%s", out)
	}
	results := map[string]string{} // alert -> what promtool said of its copy
	for _, part := range strings.Split(string(out), "Unit Testing:")[1:] {
		name := strings.TrimSpace(part)
		name = name[:max(strings.IndexByte(name, '/'), 0)]
		results[name] = part
	}
	for _, name := range names {
		if r := results[name]; !strings.Contains(r, "FAILED") || !strings.Contains(r, "alertname: "+name) {
			t.Errorf("%s made never to fire: its tests do not fail on it:\n%s", name, r)
		}
	}

	// Every job a rule selects is one the scrape configurations have, with the same rule files.
	jobRe := regexp.MustCompile(`job=~?"([^"]+)"`)
	for _, file := range []string{"rules.yml", "alerts.yml"} {
		for _, r := range readRules(t, file) {
			for _, m := range jobRe.FindAllStringSubmatch(r.Expr, -1) {
				for _, job := range strings.Split(m[1], "|") {
					if !slices.Contains(prometheusJobs, job) {
						t.Errorf("%s: %s%s selects the job %q, which no scrape configuration has", file, r.Record, r.Alert, job)
					}
				}
			}
		}
	}
	for _, name := range []string{"prometheus.yml", "prometheus-hosts.yml"} {
		c := readScrapeConfig(t, name)
		var jobs []string
		for _, sc := range c.ScrapeConfigs {
			jobs = append(jobs, sc.JobName)
			if (sc.JobName == "envoy") != (sc.MetricsPath == "/stats/prometheus") {
				t.Errorf("%s: job %s has metrics_path %q (Envoy's is /stats/prometheus, ours the default /metrics)", name, sc.JobName, sc.MetricsPath)
			}
		}
		sort.Strings(jobs)
		want := slices.Clone(prometheusJobs)
		sort.Strings(want)
		if !slices.Equal(jobs, want) {
			t.Errorf("%s: jobs %v, want %v", name, jobs, want)
		}
		if !slices.Equal(c.RuleFiles, []string{"rules.yml", "alerts.yml"}) {
			t.Errorf("%s: rule_files %v, want [rules.yml alerts.yml]", name, c.RuleFiles)
		}
	}
}

// alertTestCases reads tests.yml: the alerts with a case where they fire, and those with
// a case where they do not.
func alertTestCases(t *testing.T) (fires, quiet map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(prometheusDir, "tests.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("tests.yml: rule_files %v, want [alerts.yml]", f.RuleFiles)
	}
	fires, quiet = map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	return fires, quiet
}

// alertRunbook reads the Alerts table of docs/operations.md: alert name -> the severity it gives.
func alertRunbook(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Alerts\n")
	if !ok {
		t.Fatal(`docs/operations.md has no "### Alerts" section`)
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	out := map[string]string{}
	row := regexp.MustCompile("(?m)^\\| `(Converger[A-Za-z0-9]+)` \\[([a-z]+)\\] \\|(.*)$")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		if strings.Count(m[3], "|") < 2 {
			t.Errorf("docs/operations.md: the runbook line of %s wants what it means and what to do: %q", m[1], m[0])
		}
		out[m[1]] = m[2] // its severity
	}
	if len(out) == 0 {
		t.Fatal("docs/operations.md's Alerts section has no table rows")
	}
	return out
}

// TestPrometheusDashboard: the dashboard is importable as it is (a datasource variable,
// no input to fill in, unique panel ids), and every query is plain PromQL the end-to-end
// test can run as written.
func TestPrometheusDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard: uid %q, title %q", d.UID, d.Title)
	}
	if len(d.Templating.List) != 1 || d.Templating.List[0].Type != "datasource" || d.Templating.List[0].Query != "prometheus" {
		t.Errorf("dashboard: want one variable, a Prometheus datasource; got %+v", d.Templating.List)
	}
	ids := map[int]bool{}
	queries := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %+v, %d queries; want ${datasource} and at least one query", p.Title, p.Datasource, len(p.Targets))
		}
		for _, q := range p.Targets {
			queries++
			if q.Datasource.UID != "${datasource}" || q.Expr == "" || q.RefID == "" {
				t.Errorf("panel %q: query %+v", p.Title, q)
			}
			if strings.Contains(q.Expr, "$") {
				t.Errorf("panel %q: query %q has a variable: the test could not run it as written", p.Title, q.Expr)
			}
		}
	}
	if queries < 20 {
		t.Errorf("the dashboard has %d queries", queries)
	}
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name, Type, Query string
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type, UID string
		} `json:"datasource"`
		Targets []struct {
			Datasource struct {
				Type, UID string
			} `json:"datasource"`
			Expr  string `json:"expr"`
			RefID string `json:"refId"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := yaml.Unmarshal(b, &d); err != nil { // JSON is YAML
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

// dashboardQueries are the dashboard's queries, each with its panel's title.
func dashboardQueries(t *testing.T) [][2]string {
	var out [][2]string
	for _, p := range readDashboard(t).Panels {
		for _, q := range p.Targets {
			out = append(out, [2]string{fmt.Sprintf("panel %q", p.Title), q.Expr})
		}
	}
	return out
}

// podMonitor is the part of the Prometheus Operator's PodMonitor that
// deploy/kubernetes/podmonitor.yaml uses (decoded strictly: another field is an error).
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
				Action      string `json:"action"`
			} `json:"relabelings"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// TestPrometheusPodMonitor: the PodMonitor selects the Deployment's pods and scrapes the
// sidecar's, the core's and Envoy's named ports under the jobs the rules select, each on
// the path its program serves, and the NetworkPolicy lets the monitoring namespace reach
// them.
func TestPrometheusPodMonitor(t *testing.T) {
	files, _ := readKubernetesFiles(t)
	m, err := decodeManifests(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.podMonitors) != 1 || len(m.deployments) != 1 {
		t.Fatalf("%d PodMonitors, %d Deployments; want one each", len(m.podMonitors), len(m.deployments))
	}
	pm, d := m.podMonitors[0], m.deployments[0]
	if !selects(&pm.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("the PodMonitor's selector %v does not select the Deployment's pods %v", pm.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
	}
	monitored := map[int32]bool{}
	for _, pol := range m.policies {
		if !selects(&pol.Spec.PodSelector, d.Spec.Template.Labels) {
			continue
		}
		for _, r := range pol.Spec.Ingress {
			for _, peer := range r.From {
				if peer.NamespaceSelector != nil && peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring" {
					for _, p := range r.Ports {
						monitored[p.Port.IntVal] = true
					}
				}
			}
		}
	}
	// The program behind each named port, and the path it serves its metrics on.
	want := map[string]struct{ job, path string }{
		"sidecar": {"converger-sidecar", "/metrics"}, "core": {"converger-core", "/metrics"}, "envoy": {"envoy", "/stats/prometheus"},
	}
	var jobs []string
	for _, e := range pm.Spec.PodMetricsEndpoints {
		var port *corev1.ContainerPort
		var container string
		for _, c := range d.Spec.Template.Spec.Containers {
			for i := range c.Ports {
				if c.Ports[i].Name == e.Port {
					port, container = &c.Ports[i], c.Name
				}
			}
		}
		if port == nil {
			t.Errorf("PodMonitor endpoint %q: no container of the Deployment has a port of that name", e.Port)
			continue
		}
		job := ""
		for _, r := range e.Relabelings {
			if r.TargetLabel == "job" && (r.Action == "" || r.Action == "replace") {
				job = r.Replacement
			}
		}
		jobs = append(jobs, job)
		if w := want[container]; job != w.job || e.Path != w.path {
			t.Errorf("PodMonitor endpoint %q (container %s): job %q, path %q; want %q, %q", e.Port, container, job, e.Path, w.job, w.path)
		}
		if !monitored[port.ContainerPort] {
			t.Errorf("PodMonitor endpoint %q: the NetworkPolicy does not let the monitoring namespace reach port %d", e.Port, port.ContainerPort)
		}
	}
	sort.Strings(jobs)
	all := slices.Clone(prometheusJobs)
	sort.Strings(all)
	if !slices.Equal(jobs, all) {
		t.Errorf("the PodMonitor's jobs %v, want %v", jobs, all)
	}
}

// TestPrometheusEnvoyTargets: the envoy job's port and path, in every shipped scrape
// configuration, are routed to Envoy's admin interface by both bootstraps (the admin
// itself listens on loopback only), and the rest of that listener stays closed.
func TestPrometheusEnvoyTargets(t *testing.T) {
	for _, name := range []string{"prometheus.yml", "prometheus-hosts.yml"} {
		for _, sc := range readScrapeConfig(t, name).ScrapeConfigs {
			if sc.JobName != "envoy" {
				continue
			}
			for _, st := range sc.StaticConfigs {
				for _, target := range st.Targets {
					_, port, err := net.SplitHostPort(target)
					if err != nil {
						t.Fatalf("%s: target %q: %v", name, target, err)
					}
					p, _ := strconv.Atoi(port)
					for _, bootstrap := range []string{"envoy.yaml", "envoy-ratelimit.yaml"} {
						bs, err := envoy.ReadBootstrap(filepath.Join("..", "envoy", bootstrap))
						if err != nil {
							t.Fatal(err)
						}
						m, ok, err := envoy.RouteRequest(bs, uint32(p), "GET", "prometheus", sc.MetricsPath)
						if err != nil || !ok || m.Cluster != "envoy_admin" {
							t.Errorf("%s: GET %s on port %d (%s's envoy job) is not routed to the admin: %+v, %v, %v", bootstrap, sc.MetricsPath, p, name, m, ok, err)
						}
						if m, ok, _ := envoy.RouteRequest(bs, uint32(p), "GET", "prometheus", "/stats"); ok && m.Cluster != "" {
							t.Errorf("%s: GET /stats on port %d reaches %s: only /ready and %s may", bootstrap, p, m.Cluster, sc.MetricsPath)
						}
						if m, ok, _ := envoy.RouteRequest(bs, uint32(p), "POST", "prometheus", sc.MetricsPath); ok && m.Cluster != "" {
							t.Errorf("%s: POST %s on port %d reaches %s", bootstrap, sc.MetricsPath, p, m.Cluster)
						}
					}
				}
			}
		}
	}
}
