package deploy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/envoy"
)

const kubernetesDir = "kubernetes"

// manifests are the objects of the Kubernetes files, decoded into the API's types.
type manifests struct {
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	jobs         []*batchv1.Job
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	secrets      []*corev1.Secret
	pdbs         []*policyv1.PodDisruptionBudget
	policies     []*networkingv1.NetworkPolicy
	accounts     []*corev1.ServiceAccount
	podMonitors  []*podMonitor // the Prometheus Operator's (prometheus_test.go)
}

// decodeManifests decodes every document of files (name -> content) strictly: an unknown
// or repeated field, a wrong type or an unknown kind is an error.
func decodeManifests(files map[string][]byte) (*manifests, error) {
	m := &manifests{}
	var errs []error
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(files[name]), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				errs = append(errs, fmt.Errorf("%s document %d: %w", name, i+1, err))
				continue
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				m.deployments, obj = append(m.deployments, d), d
			case "apps/v1 StatefulSet":
				s := &appsv1.StatefulSet{}
				m.statefulSets, obj = append(m.statefulSets, s), s
			case "batch/v1 Job":
				j := &batchv1.Job{}
				m.jobs, obj = append(m.jobs, j), j
			case "v1 Service":
				s := &corev1.Service{}
				m.services, obj = append(m.services, s), s
			case "v1 ConfigMap":
				c := &corev1.ConfigMap{}
				m.configMaps, obj = append(m.configMaps, c), c
			case "v1 Secret":
				s := &corev1.Secret{}
				m.secrets, obj = append(m.secrets, s), s
			case "policy/v1 PodDisruptionBudget":
				p := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, p), p
			case "networking.k8s.io/v1 NetworkPolicy":
				p := &networkingv1.NetworkPolicy{}
				m.policies, obj = append(m.policies, p), p
			case "v1 ServiceAccount":
				a := &corev1.ServiceAccount{}
				m.accounts, obj = append(m.accounts, a), a
			case "monitoring.coreos.com/v1 PodMonitor":
				p := &podMonitor{}
				m.podMonitors, obj = append(m.podMonitors, p), p
			default:
				errs = append(errs, fmt.Errorf("%s document %d: kind %q of %q is not one these checks know", name, i+1, tm.Kind, tm.APIVersion))
				continue
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				errs = append(errs, fmt.Errorf("%s document %d (%s): %w", name, i+1, tm.Kind, err))
			}
		}
	}
	return m, errors.Join(errs...)
}

// documented are the Secrets and ConfigMaps that the README's commands create, with their
// keys: a value, or for --from-file the file in the repository.
type documented struct {
	secrets, configMaps map[string]map[string]docValue
}

type docValue struct {
	value string // --from-literal, or the value `core keys generate` prints
	file  string // --from-file: a path from the repository root
}

var (
	createRe  = regexp.MustCompile(`kubectl create (secret generic|configmap) ([a-z0-9-]+)(.*)`)
	literalRe = regexp.MustCompile(`--from-literal=([A-Za-z0-9_.-]+)=('[^']*'|"[^"]*"|\S+)`)
	fromFile  = regexp.MustCompile(`--from-file=(?:([A-Za-z0-9_.-]+)=)?(\S+)`)
	envFileRe = regexp.MustCompile(`--from-env-file=(\S+)`)
	keysToRe  = regexp.MustCompile(`core keys generate > (\S+)`)
)

// readDocumented finds the kubectl create commands in the code blocks of a README.
// keys are the values `core keys generate` printed, for the env files it writes.
func readDocumented(readme string, keys map[string]string) (*documented, error) {
	d := &documented{secrets: map[string]map[string]docValue{}, configMaps: map[string]map[string]docValue{}}
	generated := map[string]bool{}
	var errs []error
	inCode := false
	for _, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			continue
		}
		if m := keysToRe.FindStringSubmatch(line); m != nil {
			generated[m[1]] = true
		}
		m := createRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		into := d.configMaps
		if m[1] == "secret generic" {
			into = d.secrets
		}
		if into[m[2]] == nil {
			into[m[2]] = map[string]docValue{}
		}
		for _, l := range literalRe.FindAllStringSubmatch(m[3], -1) {
			into[m[2]][l[1]] = docValue{value: strings.Trim(l[2], `'"`)}
		}
		for _, f := range fromFile.FindAllStringSubmatch(m[3], -1) {
			files, err := fromFileKeys(f[1], f[2])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: --from-file=%s: %w", m[1], m[2], f[0][len("--from-file="):], err))
			}
			for key, path := range files {
				into[m[2]][key] = docValue{file: path}
			}
		}
		for _, f := range envFileRe.FindAllStringSubmatch(m[3], -1) {
			if !generated[f[1]] {
				errs = append(errs, fmt.Errorf("%s %s: --from-env-file=%s, which no `core keys generate > %s` before it writes", m[1], m[2], f[1], f[1]))
			}
			for k, v := range keys {
				into[m[2]][k] = docValue{value: v}
			}
		}
	}
	return d, errors.Join(errs...)
}

// fromFileKeys are the keys kubectl's --from-file=[key=]path makes, with their files: a
// file is one key (its name, or key); a directory one key per regular file in it whose
// name is a valid key, subdirectories left out.
func fromFileKeys(key, path string) (map[string]string, error) {
	info, err := os.Stat(filepath.Join("..", path))
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		if key == "" {
			key = filepath.Base(path)
		}
		return map[string]string{key: path}, nil
	}
	if key != "" {
		return nil, fmt.Errorf("a key cannot name a directory")
	}
	entries, err := os.ReadDir(filepath.Join("..", path))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		if e.Type().IsRegular() && configKeyRe.MatchString(e.Name()) {
			out[e.Name()] = filepath.Join(path, e.Name())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no file in the directory")
	}
	return out, nil
}

var configKeyRe = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// kube is everything the Kubernetes checks look at.
type kube struct {
	m   *manifests
	doc *documented
}

func (k *kube) secret(name string) (map[string]docValue, bool) {
	for _, s := range k.m.secrets {
		if s.Name == name {
			out := map[string]docValue{}
			for key, v := range s.Data {
				out[key] = docValue{value: string(v)}
			}
			for key, v := range s.StringData {
				out[key] = docValue{value: v}
			}
			return out, true
		}
	}
	v, ok := k.doc.secrets[name]
	return v, ok
}

func (k *kube) configMap(name string) (map[string]docValue, bool) {
	for _, c := range k.m.configMaps {
		if c.Name == name {
			out := map[string]docValue{}
			for key, v := range c.Data {
				out[key] = docValue{value: v}
			}
			return out, true
		}
	}
	v, ok := k.doc.configMaps[name]
	return v, ok
}

// podTemplate is a pod of a workload.
type podTemplate struct {
	where  string
	labels map[string]string
	spec   corev1.PodSpec
	job    bool // a Job's pod: it runs to completion, so no probes
}

func (k *kube) pods() []podTemplate {
	var out []podTemplate
	for _, d := range k.m.deployments {
		out = append(out, podTemplate{"deployment " + d.Name, d.Spec.Template.Labels, d.Spec.Template.Spec, false})
	}
	for _, s := range k.m.statefulSets {
		spec := *s.Spec.Template.Spec.DeepCopy()
		for _, claim := range s.Spec.VolumeClaimTemplates { // a volume of each pod
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: claim.Name})
		}
		out = append(out, podTemplate{"statefulset " + s.Name, s.Spec.Template.Labels, spec, false})
	}
	for _, j := range k.m.jobs {
		out = append(out, podTemplate{"job " + j.Name, j.Spec.Template.Labels, j.Spec.Template.Spec, true})
	}
	return out
}

// fakePodIP and fakePodName stand in for the downward API's values.
const (
	fakePodIP   = "10.0.0.7"
	fakePodName = "converger-0"
)

// materialize builds a container of c for checkConfig and the probe run: its
// environment with $(VAR) expanded as the kubelet does and values from Secrets, and its
// mounts as directories holding the Secrets' and ConfigMaps' files.
func (k *kube) materialize(t *testing.T, pod podTemplate, c corev1.Container, dbURL string) (*container, []error) {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	where := fmt.Sprintf("%s container %s", pod.where, c.Name)
	out := &container{where: where, program: programOf(c.Image, ""), args: c.Args, env: map[string]string{},
		mounts: map[string]string{}, indirect: map[string]bool{}}
	if len(c.Command) > 0 && out.program != "" {
		fail("%s: overrides the entrypoint of the %s image with %v", where, out.program, c.Command)
	}
	if len(out.args) == 0 && out.program != "" {
		if df, err := parseDockerfile("Dockerfile"); err == nil && df.resolved(out.program) != nil {
			out.args = df.resolved(out.program).cmd
		}
	}
	refRe := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			v = refRe.ReplaceAllStringFunc(v, func(ref string) string {
				name := ref[2 : len(ref)-1]
				out.indirect[name] = true
				if val, ok := out.env[name]; ok {
					return val
				}
				fail("%s: %s refers to $(%s), which is not defined before it", where, e.Name, name)
				return ref
			})
		case e.ValueFrom.FieldRef != nil:
			v = map[string]string{"status.podIP": fakePodIP, "metadata.name": fakePodName}[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			data, ok := k.secret(ref.Name)
			if !ok {
				fail("%s: %s comes from Secret %q, which no manifest defines and no documented command creates", where, e.Name, ref.Name)
				continue
			}
			dv, ok := data[ref.Key]
			if !ok {
				fail("%s: %s comes from key %q of Secret %q, which it does not have", where, e.Name, ref.Key, ref.Name)
			}
			v = dv.value
		default:
			fail("%s: %s: a valueFrom these checks do not know", where, e.Name)
		}
		out.env[e.Name] = v
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.spec.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			fail("%s: mounts volume %q, which the pod does not have", where, vm.Name)
			continue
		}
		dir := t.TempDir()
		out.mounts[vm.MountPath] = dir
		var data map[string]docValue
		var items []corev1.KeyToPath
		var what string
		switch {
		case v.Secret != nil:
			what, items = "Secret "+v.Secret.SecretName, v.Secret.Items
			if data, ok = k.secret(v.Secret.SecretName); !ok {
				fail("%s: volume %q is Secret %q, which no manifest defines and no documented command creates", where, v.Name, v.Secret.SecretName)
				continue
			}
		case v.ConfigMap != nil:
			what, items = "ConfigMap "+v.ConfigMap.Name, v.ConfigMap.Items
			if data, ok = k.configMap(v.ConfigMap.Name); !ok {
				fail("%s: volume %q is ConfigMap %q, which no manifest defines and no documented command creates", where, v.Name, v.ConfigMap.Name)
				continue
			}
		default:
			continue // emptyDir and the like: an empty directory
		}
		if len(items) == 0 {
			for key := range data {
				items = append(items, corev1.KeyToPath{Key: key, Path: key})
			}
		}
		files := map[string][]byte{}
		for _, it := range items {
			dv, ok := data[it.Key]
			if !ok {
				fail("%s: volume %q wants key %q of %s, which it does not have", where, v.Name, it.Key, what)
				continue
			}
			content := []byte(dv.value)
			if dv.file != "" {
				var err error
				if content, err = os.ReadFile(filepath.Join("..", dv.file)); err != nil {
					fail("%s: %v", where, err)
				}
			}
			if it.Key == "DATABASE_URL" && dbURL != "" {
				content = []byte(dbURL)
			}
			files[it.Path] = content
		}
		if err := writeVolume(dir, files); err != nil {
			t.Fatal(err)
		}
	}
	return out, errs
}

// writeVolume writes the files of a Secret or ConfigMap volume into dir as the kubelet
// does: into a directory of their own that the link ..data names, with a link per file
// to ..data/<file>. (An update swaps ..data; the programs must follow the links.)
func writeVolume(dir string, files map[string][]byte) error {
	const version = "..2026_01_02_03_04_05.000000001"
	if err := os.Mkdir(filepath.Join(dir, version), 0o755); err != nil {
		return err
	}
	tops := map[string]bool{}
	for path, content := range files {
		full := filepath.Join(dir, version, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, content, 0o600); err != nil {
			return err
		}
		tops[strings.Split(filepath.ToSlash(path), "/")[0]] = true
	}
	if err := os.Symlink(version, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for top := range tops {
		if err := os.Symlink(filepath.Join("..data", top), filepath.Join(dir, top)); err != nil {
			return err
		}
	}
	return nil
}

// checkKubernetes checks the manifests and returns every problem found.
func checkKubernetes(t *testing.T, k *kube) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	var clusterNames []string // CLUSTER_DNS_NAME of the sidecars
	rlsBootstraps := 0        // bootstraps with the global rate limit filter an Envoy may run
	var gossipPorts []string
	for _, pod := range k.pods() {
		spec := pod.spec
		psc := spec.SecurityContext
		if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			fail("%s: the pod's securityContext has no seccompProfile RuntimeDefault", pod.where)
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			fail("%s: automountServiceAccountToken is not false (nothing here talks to the API server)", pod.where)
		}
		containers := map[string]*container{}
		var members []string
		for _, c := range spec.Containers {
			where := fmt.Sprintf("%s container %s", pod.where, c.Name)
			if err := pinnedImage(c.Image); err != nil {
				fail("%s: %v", where, err)
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; !ok {
					fail("%s: no %s request", where, r)
				}
				if _, ok := c.Resources.Limits[r]; !ok {
					fail("%s: no %s limit", where, r)
				}
			}
			errs = append(errs, checkSecurityContext(where, psc, c.SecurityContext)...)
			if !pod.job {
				if c.ReadinessProbe == nil || c.LivenessProbe == nil {
					fail("%s: needs a readinessProbe and a livenessProbe", where)
				}
				for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
					if p != nil && portOf(c, probePort(p)) == 0 && p.Exec == nil {
						fail("%s: a probe's port %s is not a port of the container", where, portString(probePort(p)))
					}
				}
			}
			mc, merrs := k.materialize(t, pod, c, "")
			errs = append(errs, merrs...)
			containers[c.Name], members = mc, append(members, c.Name)
			if mc.program != "" {
				errs = append(errs, checkConfig(mc)...)
				// Off loopback, a listener must be a port of the container, which the
				// NetworkPolicy check below sees.
				for v, addr := range listensBeyondLoopback(mc) {
					_, port, _ := net.SplitHostPort(addr)
					if n, _ := strconv.Atoi(port); portOf(c, intstr.FromInt(n)) == 0 {
						fail("%s: %s=%s listens beyond loopback on a port that is not a port of the container", where, v, addr)
					}
				}
			}
			if mc.program == "sidecar" {
				clusterNames = append(clusterNames, mc.env["CLUSTER_DNS_NAME"])
				_, port, _ := net.SplitHostPort(mc.env["CLUSTER_BIND_ADDR"])
				gossipPorts = append(gossipPorts, port)
			}
		}
		// Envoy: the bootstrap it runs, and the others of envoy/ mounted beside it (the
		// documented switch: -c names another), are the repository's; their listeners are
		// container ports, their upstreams are served in the pod, their rate limit domains
		// have rules in the sidecar, the probes are routes they have.
		for _, c := range spec.Containers {
			if !strings.HasPrefix(c.Image, "envoyproxy/envoy:") {
				continue
			}
			where := fmt.Sprintf("%s container %s", pod.where, c.Name)
			mc := containers[c.Name]
			path, err := envoyConfigArg(c.Args)
			if err != nil {
				fail("%s: %v", where, err)
				continue
			}
			paths := []string{path}
			entries, _ := os.ReadDir(mc.hostPath(filepath.Dir(path)))
			for _, e := range entries {
				other := filepath.Join(filepath.Dir(path), e.Name())
				if !strings.HasPrefix(e.Name(), ".") && strings.HasSuffix(e.Name(), ".yaml") && other != path {
					paths = append(paths, other)
				}
			}
			for _, path := range paths {
				bs, err := readEnvoyBootstrap(mc, path)
				if err != nil {
					fail("%s: %v", where, err)
					continue
				}
				errs = append(errs, checkEnvoyBootstrap(where, path, c, bs, containers, members)...)
				if path == paths[0] { // the one it runs
					errs = append(errs, checkPodTLS(where, path, bs, mc, containers, members)...)
				}
				if n, perrs := checkEnvoyPod(pod.where, path, bs, containers, members); len(perrs) > 0 {
					errs = append(errs, perrs...)
				} else if n > 0 {
					rlsBootstraps++
				}
			}
		}
	}
	if len(k.m.deployments) > 0 && rlsBootstraps == 0 {
		fail("no Envoy of the manifests can run a bootstrap with the global rate limit filter (envoy-ratelimit.yaml beside envoy.yaml)")
	}

	// Services: their pods exist and have the target ports; the headless one is the
	// sidecars' CLUSTER_DNS_NAME and carries their cluster port.
	for _, s := range k.m.services {
		pods := k.selected(s.Spec.Selector)
		if len(pods) == 0 {
			fail("service %s: its selector %v matches no pod", s.Name, s.Spec.Selector)
		}
		for _, sp := range s.Spec.Ports {
			for _, pod := range pods {
				if !slices.ContainsFunc(pod.spec.Containers, func(c corev1.Container) bool {
					return portOfProto(c, sp.TargetPort, sp.Protocol) != 0
				}) {
					fail("service %s: port %s targets %s/%s, which no container of %s has", s.Name, sp.Name, sp.TargetPort.String(), sp.Protocol, pod.where)
				}
			}
		}
	}
	for i, name := range clusterNames {
		var headless *corev1.Service
		for _, s := range k.m.services {
			if s.Name == name {
				headless = s
			}
		}
		switch {
		case headless == nil:
			fail("the sidecars' CLUSTER_DNS_NAME %q is not a Service of the manifests", name)
		case headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses:
			fail("service %s: the sidecars' peers must be headless (clusterIP: None) and publishNotReadyAddresses", name)
		default:
			for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
				if !slices.ContainsFunc(headless.Spec.Ports, func(p corev1.ServicePort) bool {
					return strconv.Itoa(int(p.Port)) == gossipPorts[i] && p.Protocol == proto
				}) {
					fail("service %s: no %s port %s, the sidecars' CLUSTER_BIND_ADDR", name, proto, gossipPorts[i])
				}
			}
		}
	}

	// Disruption budget and network policy for the Deployment's pods.
	for _, d := range k.m.deployments {
		where := "deployment " + d.Name
		if !slices.ContainsFunc(k.m.pdbs, func(p *policyv1.PodDisruptionBudget) bool {
			return selects(p.Spec.Selector, d.Spec.Template.Labels)
		}) {
			fail("%s: no PodDisruptionBudget selects its pods", where)
		}
		var policy *networkingv1.NetworkPolicy
		for _, p := range k.m.policies {
			if selects(&p.Spec.PodSelector, d.Spec.Template.Labels) {
				policy = p
			}
		}
		if policy == nil {
			fail("%s: no NetworkPolicy selects its pods", where)
			continue
		}
		errs = append(errs, checkPolicy(where, policy, d.Spec.Template.Spec)...)
	}
	return errs
}

// checkEnvoyBootstrap checks an Envoy container against one bootstrap: its listeners are
// ports of the container, its probes are routed to the admin's readiness or on a listener.
func checkEnvoyBootstrap(where, path string, c corev1.Container, bs *bootstrapv3.Bootstrap, containers map[string]*container, members []string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for name, port := range envoy.ListenerPorts(bs) {
		if portOf(c, intstr.FromInt32(int32(port))) == 0 {
			fail("%s: %s's listener %s (port %d) is not a port of the container", where, path, name, port)
		}
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil {
			continue
		}
		port := uint32(portOf(c, probePort(p)))
		if p.HTTPGet != nil {
			m, ok, err := envoy.RouteRequest(bs, port, "GET", "probe", p.HTTPGet.Path)
			if err != nil || !ok || m.Cluster != "envoy_admin" || !slices.Contains(adminProbePaths, p.HTTPGet.Path) {
				fail("%s: with %s, probe GET %s on port %d is not routed to the admin's readiness (%+v, %v, %v)", where, path, p.HTTPGet.Path, port, m, ok, err)
			}
		} else if !listenerOn(envoy.ListenerPorts(bs), port) {
			fail("%s: probe on port %d, where %s has no listener", where, port, path)
		}
	}
	return errs
}

// adminProbePaths are the admin interface's endpoints a probe may use.
var adminProbePaths = []string{"/ready"}

// metricsPorts are the sidecar's HTTP port (metrics, /debug/counter, /check), the
// core's ops port (metrics, health) and Envoy's probe listener (/ready, and the admin
// interface's /stats/prometheus): only a monitoring namespace may reach them.
var metricsPorts = map[string]bool{"8082": true, "8083": true, "9902": true}

// checkPolicy: only Envoy's public listener is open to all; the cluster port to some, the
// metrics ports to a monitoring namespace only; nothing else is listed.
func checkPolicy(where string, p *networkingv1.NetworkPolicy, spec corev1.PodSpec) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		fail("networkpolicy %s: does not restrict ingress", p.Name)
	}
	open := map[string]bool{}       // ports anyone may reach
	restricted := map[string]bool{} // ports some may reach
	for _, rule := range p.Spec.Ingress {
		if len(rule.Ports) == 0 {
			fail("networkpolicy %s: a rule without ports opens every port", p.Name)
		}
		for _, port := range rule.Ports {
			key := port.Port.String()
			if len(rule.From) == 0 {
				open[key] = true
			} else {
				restricted[key] = true
			}
			for _, peer := range rule.From {
				if metricsPorts[key] && !oneNamespace(peer) {
					fail("networkpolicy %s: lets %s reach port %s (metrics); only a monitoring namespace may", p.Name, peerString(peer), key)
				}
			}
		}
	}
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			port := strconv.Itoa(int(cp.ContainerPort))
			switch {
			case cp.ContainerPort == 10000:
				if !open[port] {
					fail("%s: the NetworkPolicy does not let clients reach Envoy's listener %s", where, port)
				}
			case open[port]:
				fail("%s: the NetworkPolicy opens port %s (%s of %s) to every pod; only Envoy's listener may be", where, port, cp.Name, c.Name)
			}
		}
	}
	for port := range restricted {
		if port != "7946" && !metricsPorts[port] {
			fail("networkpolicy %s: lets some pods reach port %s directly", p.Name, port)
		}
	}
	return errs
}

// oneNamespace: a peer that is every pod of one namespace named by its
// kubernetes.io/metadata.name label.
func oneNamespace(peer networkingv1.NetworkPolicyPeer) bool {
	ns := peer.NamespaceSelector
	return peer.PodSelector == nil && peer.IPBlock == nil && ns != nil && len(ns.MatchExpressions) == 0 &&
		len(ns.MatchLabels) == 1 && ns.MatchLabels["kubernetes.io/metadata.name"] != ""
}

func peerString(peer networkingv1.NetworkPolicyPeer) string {
	b, _ := yaml.Marshal(peer)
	return strings.Join(strings.Fields(string(b)), " ")
}

func (k *kube) selected(selector map[string]string) []podTemplate {
	var out []podTemplate
	for _, pod := range k.pods() {
		if len(selector) > 0 && selects(&metav1.LabelSelector{MatchLabels: selector}, pod.labels) {
			out = append(out, pod)
		}
	}
	return out
}

func selects(s *metav1.LabelSelector, labels map[string]string) bool {
	if s == nil || len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
		return false // selecting everything is not what these manifests mean
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return len(s.MatchExpressions) == 0
}

func portString(p intstr.IntOrString) string { return p.String() }

func probePort(p *corev1.Probe) intstr.IntOrString {
	switch {
	case p.HTTPGet != nil:
		return p.HTTPGet.Port
	case p.TCPSocket != nil:
		return p.TCPSocket.Port
	case p.GRPC != nil:
		return intstr.FromInt32(p.GRPC.Port)
	}
	return intstr.IntOrString{}
}

// portOf resolves a port of a container by name or number (TCP); 0 when it has none.
func portOf(c corev1.Container, port intstr.IntOrString) int {
	return portOfProto(c, port, corev1.ProtocolTCP)
}

func portOfProto(c corev1.Container, port intstr.IntOrString, proto corev1.Protocol) int {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, p := range c.Ports {
		pp := p.Protocol
		if pp == "" {
			pp = corev1.ProtocolTCP
		}
		if pp != proto {
			continue
		}
		if port.Type == intstr.String && p.Name == port.StrVal || port.Type == intstr.Int && p.ContainerPort == port.IntVal {
			return int(p.ContainerPort)
		}
	}
	return 0
}

// checkSecurityContext: non-root, no privilege escalation, a read-only root, no
// capabilities; the container's settings win over the pod's.
func checkSecurityContext(where string, pod *corev1.PodSecurityContext, c *corev1.SecurityContext) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c == nil {
		return []error{fmt.Errorf("%s: no securityContext", where)}
	}
	nonRoot := c.RunAsNonRoot
	if nonRoot == nil && pod != nil {
		nonRoot = pod.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		fail("%s: runAsNonRoot is not true", where)
	}
	if c.RunAsUser == nil || *c.RunAsUser == 0 {
		fail("%s: runAsUser is not set to a non-root uid (the scratch images have no user names)", where)
	}
	if c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation {
		fail("%s: allowPrivilegeEscalation is not false", where)
	}
	if c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		fail("%s: readOnlyRootFilesystem is not true", where)
	}
	if c.Capabilities == nil || !slices.Contains(c.Capabilities.Drop, "ALL") || len(c.Capabilities.Add) > 0 {
		fail("%s: capabilities must drop ALL and add none", where)
	}
	if c.Privileged != nil && *c.Privileged {
		fail("%s: privileged", where)
	}
	return errs
}

// loadKube reads the manifests (files by name, as in kubernetesDir) and the README's
// commands, with keys from `core keys generate`.
func loadKube(t *testing.T, files map[string][]byte, readme string) (*kube, error) {
	m, err := decodeManifests(files)
	if err != nil {
		return nil, err
	}
	doc, err := readDocumented(readme, generatedKeys(t))
	if err != nil {
		return nil, err
	}
	return &kube{m: m, doc: doc}, nil
}

// generatedKeys runs `core keys generate` and returns what it printed.
func generatedKeys(t *testing.T) map[string]string {
	var out, stderr strings.Builder
	if code := manage.Run(context.Background(), []string{"keys", "generate"}, manage.Env{Getenv: func(string) string { return "" }}, &out, &stderr); code != 0 {
		t.Fatalf("core keys generate: %d %s", code, stderr.String())
	}
	keys := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = v
		}
	}
	return keys
}

func readKubernetesFiles(t *testing.T) (map[string][]byte, string) {
	files := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	for _, p := range paths {
		if strings.HasSuffix(p, ".patch.yaml") {
			continue // a patch of a manifest, not one (kubernetes_tls_test.go)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	readme, err := os.ReadFile(filepath.Join(kubernetesDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return files, string(readme)
}

func TestKubernetesManifests(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	k, err := loadKube(t, files, readme)
	if err != nil {
		t.Fatal(err)
	}
	if len(k.m.deployments) != 1 || len(k.m.jobs) != 1 || len(k.m.statefulSets) != 1 {
		t.Fatalf("want the Deployment, the migration Job and the development StatefulSet; got %d, %d, %d",
			len(k.m.deployments), len(k.m.jobs), len(k.m.statefulSets))
	}
	if len(k.m.secrets) > 0 {
		t.Errorf("a Secret is in the manifests (%s): secrets are made by the documented commands only", k.m.secrets[0].Name)
	}
	if errs := checkKubernetes(t, k); len(errs) > 0 {
		t.Fatalf("deploy/kubernetes:\n%v", errors.Join(errs...))
	}

	// The README's switch to the global rate limits: its args line in place of the
	// Deployment's runs a bootstrap of the mount with the rate limit filter.
	argsRe := regexp.MustCompile(`(?m)^ *args: \["-c", "[^"]+", "--disable-hot-restart"\]$`)
	documented := argsRe.FindString(readme)
	if documented == "" || !argsRe.MatchString(string(files["converger.yaml"])) {
		t.Fatal("no Envoy args line in the README's switch, or in converger.yaml, to compare")
	}
	switched := maps.Clone(files)
	switched["converger.yaml"] = []byte(argsRe.ReplaceAllLiteralString(string(files["converger.yaml"]), documented))
	if k, err = loadKube(t, switched, readme); err != nil {
		t.Fatal(err)
	}
	if errs := checkKubernetes(t, k); len(errs) > 0 {
		t.Fatalf("deploy/kubernetes with the README's %s:\n%v", strings.TrimSpace(documented), errors.Join(errs...))
	}
	for _, c := range k.m.deployments[0].Spec.Template.Spec.Containers {
		if !strings.HasPrefix(c.Image, "envoyproxy/envoy:") {
			continue
		}
		path, _ := envoyConfigArg(c.Args)
		if bs, err := envoy.ReadBootstrap(filepath.Join("..", "envoy", filepath.Base(path))); err != nil {
			t.Error(err)
		} else if domains, _ := rateLimitDomains(bs); len(domains) == 0 {
			t.Errorf("the README's switch runs %s, which has no global rate limit filter", path)
		}
	}
}

// TestKubernetesChecksFail: each check can fail, on a broken copy of the manifests.
func TestKubernetesChecksFail(t *testing.T) {
	files, readme := readKubernetesFiles(t)
	cases := []struct {
		name, file, old, new, readmeOld, readmeNew string
		edit                                       func(*kube) // after loading
		want                                       string
	}{
		{name: "an unknown field", file: "converger.yaml", old: "  replicas: 3\n", new: "  replicas: 3\n  replica: 3\n", want: `unknown field "replica"`},
		{name: "an undefined Secret", file: "converger.yaml", old: "secretName: converger-db", new: "secretName: converger-database",
			want: `Secret "converger-database", which no manifest defines and no documented command creates`},
		{name: "a Secret whose command is gone", readmeOld: "kubectl create secret generic converger-keys --from-env-file=keys.env", readmeNew: "",
			want: `Secret "converger-keys", which no manifest defines`},
		{name: "a key the Secret lacks", file: "converger.yaml", old: "{key: ENCRYPTION_KEY, path: ENCRYPTION_KEY}", new: "{key: ENCRYPTION, path: ENCRYPTION_KEY}",
			want: `wants key "ENCRYPTION" of Secret converger-keys`},
		{name: "an undefined ConfigMap", file: "converger.yaml", old: "name: converger-envoy\n", new: "name: converger-proxy\n",
			want: `ConfigMap "converger-proxy"`},
		{name: "a ConfigMap whose command is gone", readmeOld: "kubectl create configmap converger-ratelimit --from-file=envoy/ratelimit/", readmeNew: "",
			want: `ConfigMap "converger-ratelimit", which no manifest defines`},
		{name: "a documented file that is not there", readmeOld: "--from-file=envoy/ratelimit/", readmeNew: "--from-file=envoy/rules/",
			want: "--from-file=envoy/rules/: stat ../envoy/rules: no such file"},
		{name: "a bootstrap that is not the repository's", readmeOld: "--from-file=envoy/envoy-ratelimit.yaml", readmeNew: "--from-file=envoy-ratelimit.yaml=envoy/envoy.yaml",
			want: "its bootstrap /etc/envoy/envoy-ratelimit.yaml is not envoy/envoy-ratelimit.yaml of the repository"},
		{name: "a rule file with a mistake in the ConfigMap", edit: func(k *kube) {
			k.doc.configMaps["converger-ratelimit"]["edge.yaml"] = docValue{value: "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"}
		}, want: "edge.yaml: line 4: descriptors[0].rate_limit: invalid rate limit unit 'fortnight'"},
		{name: "the rate limit service without rules", file: "converger.yaml", old: "            - {name: RLS_CONFIG_DIR, value: /etc/converger/ratelimit}\n", new: "",
			want: `/etc/envoy/envoy-ratelimit.yaml asks the rate limit service for domain "edge", which no sidecar of the namespace has valid rules for`},
		{name: "no bootstrap with the rate limit filter", file: "converger.yaml", old: ", {key: envoy-ratelimit.yaml, path: envoy-ratelimit.yaml}", new: "",
			want: "no Envoy of the manifests can run a bootstrap with the global rate limit filter"},
		{name: "an untagged image", file: "converger.yaml", old: "image: converger/core:0.1.0", new: "image: converger/core", want: `image "converger/core" has no tag`},
		{name: "an unknown variable", file: "converger.yaml", old: `{name: LIMITER_ADDR, value: "127.0.0.1:8081"}`,
			new: `{name: LIMITER_ADDR, value: "127.0.0.1:8081"}` + "\n            - {name: LIMITER_ADRESS, value: x}", want: "LIMITER_ADRESS is not a variable core reads"},
		{name: "a probe on a port the container lacks", file: "converger.yaml", old: "httpGet: {path: /readyz, port: metrics}", new: "httpGet: {path: /readyz, port: 9090}",
			want: "a probe's port 9090 is not a port"},
		{name: "no probes", file: "converger.yaml", old: "          livenessProbe:\n            httpGet: {path: /healthz, port: metrics}\n            periodSeconds: 10\n", new: "",
			want: "container sidecar: needs a readinessProbe and a livenessProbe"},
		{name: "Envoy probed off its routes", file: "converger.yaml", old: "httpGet: {path: /ready, port: envoy-probes}", new: "httpGet: {path: /stats, port: envoy-probes}",
			want: "probe GET /stats on port 9902 is not routed"},
		{name: "no limits", file: "converger.yaml", old: "            limits: {cpu: \"2\", memory: 512Mi}\n", new: "", want: "container core: no cpu limit"},
		{name: "a writable root", file: "migrate.yaml", old: "readOnlyRootFilesystem: true", new: "readOnlyRootFilesystem: false", want: "readOnlyRootFilesystem is not true"},
		{name: "a wrong peers name", file: "converger.yaml", old: "{name: CLUSTER_DNS_NAME, value: converger-peers}", new: "{name: CLUSTER_DNS_NAME, value: converger-gossip}",
			want: `CLUSTER_DNS_NAME "converger-gossip" is not a Service`},
		{name: "the cluster port open to all", file: "converger.yaml", old: "        - {port: 10000, protocol: TCP}\n", new: "        - {port: 10000, protocol: TCP}\n        - {port: 7946, protocol: TCP}\n",
			want: "opens port 7946"},
		{name: "the core off loopback for Envoy", file: "converger.yaml", old: `{name: CORE_ADDR, value: "127.0.0.1:8080"}`, new: `{name: CORE_ADDR, value: "127.0.0.1:8090"}`,
			want: `sends cluster "core" to 127.0.0.1:8080`},
		{name: "the core's API on every interface", file: "converger.yaml", old: `{name: CORE_ADDR, value: "127.0.0.1:8080"}`, new: `{name: CORE_ADDR, value: "0.0.0.0:8080"}`,
			want: "container core: CORE_ADDR=0.0.0.0:8080 listens beyond loopback on a port that is not a port of the container"},
		{name: "the core's ops port undeclared", file: "converger.yaml", old: "            - {name: core-ops, containerPort: 8083, protocol: TCP}\n", new: "",
			want: "container core: CORE_OPS_ADDR=0.0.0.0:8083 listens beyond loopback"},
		{name: "a core probe off its ops port", file: "converger.yaml", old: "httpGet: {path: /readyz, port: core-ops}", new: "httpGet: {path: /readyz, port: 8080}",
			want: "container core: a probe's port 8080 is not a port"},
		{name: "the core's metrics open to all", file: "converger.yaml", old: "        - {port: 10000, protocol: TCP}\n", new: "        - {port: 10000, protocol: TCP}\n        - {port: 8083, protocol: TCP}\n",
			want: "opens port 8083 (core-ops of core) to every pod"},
		{name: "the metrics open to every namespace", file: "converger.yaml", old: "        - namespaceSelector:\n            matchLabels: {kubernetes.io/metadata.name: monitoring}\n", new: "        - namespaceSelector: {}\n",
			want: "reach port 8083 (metrics); only a monitoring namespace may"},
		{name: "a Service to a missing port", file: "converger.yaml", old: "targetPort: http, protocol: TCP}", new: "targetPort: web, protocol: TCP}",
			want: "service converger: port http targets web/TCP"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			broken := map[string][]byte{}
			for k, v := range files {
				broken[k] = v
			}
			r := readme
			if tc.file != "" {
				if !strings.Contains(string(files[tc.file]), tc.old) {
					t.Fatalf("test setup: %q is not in %s", tc.old, tc.file)
				}
				broken[tc.file] = []byte(strings.Replace(string(files[tc.file]), tc.old, tc.new, 1))
			}
			if tc.readmeOld != "" {
				if !strings.Contains(r, tc.readmeOld) {
					t.Fatalf("test setup: %q is not in the README", tc.readmeOld)
				}
				r = strings.Replace(r, tc.readmeOld, tc.readmeNew, 1)
			}
			k, err := loadKube(t, broken, r)
			var all error = err
			if err == nil && tc.edit != nil {
				tc.edit(k)
			}
			if err == nil {
				all = errors.Join(checkKubernetes(t, k)...)
			}
			if all == nil || !strings.Contains(all.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got:\n%v", tc.want, all)
			}
		})
	}
}
