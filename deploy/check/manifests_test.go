package check

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// manifests is every object in deploy/kubernetes, by kind.
type manifests struct {
	configMaps   map[string]*corev1.ConfigMap
	secrets      map[string]*corev1.Secret
	services     map[string]*corev1.Service
	statefulSets map[string]*appsv1.StatefulSet
	deployments  map[string]*appsv1.Deployment
	pdbs         map[string]*policyv1.PodDisruptionBudget
}

// workload is a StatefulSet or Deployment: what the checks need of either.
type workload struct {
	name     string
	replicas *int32
	selector *metav1.LabelSelector
	pod      corev1.PodTemplateSpec
}

func (m *manifests) workloads() []workload {
	var out []workload
	for n, s := range m.statefulSets {
		out = append(out, workload{"StatefulSet/" + n, s.Spec.Replicas, s.Spec.Selector, s.Spec.Template})
	}
	for n, d := range m.deployments {
		out = append(out, workload{"Deployment/" + n, d.Spec.Replicas, d.Spec.Selector, d.Spec.Template})
	}
	return out
}

var kubeDir = filepath.Join(repoRoot, "deploy", "kubernetes")

// secretDir is the folder under kubeDir that holds the Secret's template,
// out of the way of kubectl apply -f deploy/kubernetes/.
const secretDir = "secret"

// docSeparator is a YAML document separator line.
var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		services: map[string]*corev1.Service{}, statefulSets: map[string]*appsv1.StatefulSet{},
		deployments: map[string]*appsv1.Deployment{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
	}
	kinds := m.kinds()
	files, err := filepath.Glob(filepath.Join(kubeDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no files in deploy/kubernetes")
	}
	// The Secret's template sits in a folder of its own, so that applying
	// the folder never overwrites a Secret made with kubectl create secret.
	secretFiles, err := filepath.Glob(filepath.Join(kubeDir, secretDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, secretFiles...) {
		if fi, err := os.Stat(f); err == nil && fi.IsDir() {
			if filepath.Base(f) != secretDir || filepath.Dir(f) != kubeDir {
				t.Errorf("%s: a folder other than %s/", f, secretDir)
			}
			continue
		}
		if ext := filepath.Ext(f); ext != ".yaml" && ext != ".yml" {
			// kubectl apply -f dir/ reads .json too; nothing else belongs here.
			t.Errorf("%s: not a manifest (kubectl apply -f deploy/kubernetes/ would read it or skip it)", f)
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSeparator.Split(string(b), -1) {
			where := fmt.Sprintf("%s#%d", filepath.Base(f), i)
			if isBlank(doc) {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			k, ok := kinds[tm.Kind]
			if !ok {
				t.Errorf("%s: kind %q is not one this test knows how to check", where, tm.Kind)
				continue
			}
			if tm.APIVersion != k.apiVersion {
				t.Errorf("%s: %s apiVersion %q, want %q", where, tm.Kind, tm.APIVersion, k.apiVersion)
			}
			obj, file := k.decode()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Errorf("%s: %s: %v", where, tm.Kind, err)
				continue
			}
			name := obj.GetName()
			if name == "" {
				t.Errorf("%s: %s without metadata.name", where, tm.Kind)
			}
			if ns := obj.GetNamespace(); ns != "" {
				t.Errorf("%s: %s/%s sets namespace %q: the user picks it (kubectl apply -n)", where, tm.Kind, name, ns)
			}
			if file(name) {
				t.Errorf("%s: a second %s named %s", where, tm.Kind, name)
			}
			if inSecretDir := filepath.Dir(f) != kubeDir; (tm.Kind == "Secret") != inSecretDir {
				t.Errorf("%s: %s: Secrets, and only they, belong in %s/ (kubectl apply -f deploy/kubernetes/ must not overwrite a Secret made with kubectl create secret)", where, tm.Kind, secretDir)
			}
		}
	}
	return m
}

// kind is a kind deploy/kubernetes may hold: the apiVersion it must carry,
// and decode, which returns a new object of the kind and the function that
// files it in the manifests under its name once decoded, saying whether the
// name was taken.
type kind struct {
	apiVersion string
	decode     func() (obj metav1.Object, file func(name string) (dup bool))
}

// kinds are the kinds this test checks, each filed in its map of m.
func (m *manifests) kinds() map[string]kind {
	return map[string]kind{
		"ConfigMap":           {"v1", into(m.configMaps)},
		"Secret":              {"v1", into(m.secrets)},
		"Service":             {"v1", into(m.services)},
		"StatefulSet":         {"apps/v1", into(m.statefulSets)},
		"Deployment":          {"apps/v1", into(m.deployments)},
		"PodDisruptionBudget": {"policy/v1", into(m.pdbs)},
	}
}

// into is the decode of a kind whose objects are filed in byName.
func into[T any, P interface {
	*T
	metav1.Object
}](byName map[string]P) func() (metav1.Object, func(string) bool) {
	return func() (metav1.Object, func(string) bool) {
		o := P(new(T))
		return o, func(name string) bool {
			_, dup := byName[name]
			byName[name] = o
			return dup
		}
	}
}

func isBlank(doc string) bool {
	for _, l := range strings.Split(doc, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// TestManifestsDecodeStrictly: every document in deploy/kubernetes decodes
// strictly into its k8s.io/api type, and the set is whole: every ConfigMap,
// Secret and Service it names exists, selectors select the pods, probes use
// named ports, resources and a locked-down securityContext are set, and the
// config in the ConfigMap is one sigwatch accepts with the Secret's token.
func TestManifestsDecodeStrictly(t *testing.T) {
	m := loadManifests(t)
	ws := m.workloads()
	if len(ws) != 1 {
		t.Fatalf("%d workloads (StatefulSet or Deployment), want 1", len(ws))
	}
	for _, want := range []string{"ConfigMap", "Secret", "Service", "PodDisruptionBudget"} {
		n := map[string]int{"ConfigMap": len(m.configMaps), "Secret": len(m.secrets), "Service": len(m.services), "PodDisruptionBudget": len(m.pdbs)}[want]
		if n == 0 {
			t.Errorf("no %s", want)
		}
	}
	w := ws[0]
	if w.replicas == nil || *w.replicas != 2 {
		t.Errorf("%s: replicas %v, want 2", w.name, w.replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(w.selector)
	if err != nil || sel.Empty() {
		t.Fatalf("%s: selector %v: %v", w.name, w.selector, err)
	}
	podLabels := labels.Set(w.pod.Labels)
	if !sel.Matches(podLabels) {
		t.Errorf("%s: selector %s does not match its pod labels %v", w.name, sel, podLabels)
	}
	for n, s := range m.statefulSets {
		svc, ok := m.services[s.Spec.ServiceName]
		if !ok {
			t.Errorf("StatefulSet/%s: serviceName %q is not a Service here", n, s.Spec.ServiceName)
		} else if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("StatefulSet/%s: its serviceName %s is not headless", n, s.Spec.ServiceName)
		}
	}

	pod := w.pod.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", w.name, len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	checkPort := func(what string, port intstr.IntOrString) {
		if port.Type != intstr.String {
			t.Errorf("%s: port %s is a number: use the container's named port", what, port.String())
		} else if _, ok := ports[port.StrVal]; !ok {
			t.Errorf("%s: port %q is not a named port of the container (%v)", what, port.StrVal, ports)
		}
	}
	checkProbe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe on %s", what, path)
			return
		}
		if p.HTTPGet.Path != path {
			t.Errorf("%s: path %s, want %s", what, p.HTTPGet.Path, path)
		}
		checkPort(what, p.HTTPGet.Port)
	}
	checkProbe("readinessProbe", c.ReadinessProbe, "/readyz")
	checkProbe("livenessProbe", c.LivenessProbe, "/healthz")
	if c.StartupProbe != nil {
		checkProbe("startupProbe", c.StartupProbe, "/healthz")
	}

	// Resources: requests and limits of CPU and memory, requests within limits.
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := c.Resources.Requests[r]
		lim, okLim := c.Resources.Limits[r]
		if !okReq || !okLim {
			t.Errorf("resources: %s request %v and limit %v: want both", r, okReq, okLim)
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("resources: %s request %s above its limit %s", r, req.String(), lim.String())
		}
	}
	// GOMEMLIMIT below the memory limit.
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			q, err := resource.ParseQuantity(strings.TrimSuffix(e.Value, "B"))
			if lim := c.Resources.Limits[corev1.ResourceMemory]; err != nil || q.Cmp(lim) >= 0 {
				t.Errorf("GOMEMLIMIT %s: want below the memory limit %s (%v)", e.Value, lim.String(), err)
			}
		}
	}

	// Locked down: not root, read-only root, no capabilities.
	sc := c.SecurityContext
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Error("securityContext: want runAsNonRoot: true")
		}
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("securityContext: want readOnlyRootFilesystem: true")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("securityContext: want allowPrivilegeEscalation: false")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Error("securityContext: want capabilities drop [ALL]")
	}

	// References: every ConfigMap and Secret the pod names exists, with the keys it names.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			cm, ok := m.configMaps[v.ConfigMap.Name]
			if !ok {
				t.Errorf("volume %s: ConfigMap %q is not here", v.Name, v.ConfigMap.Name)
				continue
			}
			for _, it := range v.ConfigMap.Items {
				if _, ok := cm.Data[it.Key]; !ok {
					t.Errorf("volume %s: ConfigMap %s has no key %s", v.Name, cm.Name, it.Key)
				}
			}
		case v.Secret != nil:
			if _, ok := m.secrets[v.Secret.SecretName]; !ok {
				t.Errorf("volume %s: Secret %q is not here", v.Name, v.Secret.SecretName)
			}
		}
	}
	for _, vm := range c.VolumeMounts {
		if _, ok := volumes[vm.Name]; !ok {
			t.Errorf("volumeMount %s: no such volume", vm.Name)
		}
	}
	for _, ef := range c.EnvFrom {
		if ef.SecretRef != nil {
			if _, ok := m.secrets[ef.SecretRef.Name]; !ok {
				t.Errorf("envFrom: Secret %q is not here", ef.SecretRef.Name)
			}
		}
		if ef.ConfigMapRef != nil {
			if _, ok := m.configMaps[ef.ConfigMapRef.Name]; !ok {
				t.Errorf("envFrom: ConfigMap %q is not here", ef.ConfigMapRef.Name)
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			continue
		}
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			if s, ok := m.secrets[r.Name]; !ok {
				t.Errorf("env %s: Secret %q is not here", e.Name, r.Name)
			} else if _, ok := s.StringData[r.Key]; !ok {
				t.Errorf("env %s: Secret %s has no key %s", e.Name, r.Name, r.Key)
			}
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			if cm, ok := m.configMaps[r.Name]; !ok {
				t.Errorf("env %s: ConfigMap %q is not here", e.Name, r.Name)
			} else if _, ok := cm.Data[r.Key]; !ok {
				t.Errorf("env %s: ConfigMap %s has no key %s", e.Name, r.Name, r.Key)
			}
		}
	}

	// Services select the pods, on the container's named ports.
	for n, svc := range m.services {
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service/%s: selector %v does not select the pods (%v)", n, svc.Spec.Selector, podLabels)
		}
		for _, p := range svc.Spec.Ports {
			checkPort("Service/"+n, p.TargetPort)
		}
	}
	// The PodDisruptionBudget covers the pods and lets one go at a time.
	for n, pdb := range m.pdbs {
		s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || s.Empty() || !s.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget/%s: selector %v does not select the pods (%v)", n, pdb.Spec.Selector, err)
		}
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" {
			t.Errorf("PodDisruptionBudget/%s: maxUnavailable %v, want 1", n, pdb.Spec.MaxUnavailable)
		}
	}
	// The scrape annotation names the container's port.
	if p := w.pod.Annotations["prometheus.io/port"]; p != "" && p != fmt.Sprint(ports["http"]) {
		t.Errorf("prometheus.io/port %s, the http port is %d", p, ports["http"])
	}

	checkPodConfig(t, m, w, c)
}

// checkPodConfig runs sigwatch config check on the config file the pod
// mounts, with the environment the pod gets (its env and the Secret), as
// each replica: it loads strictly and validates with the Secret's token
// filled in, is refused while the token is empty as shipped, and gives each
// pod its own MQTT client id.
func checkPodConfig(t *testing.T, m *manifests, w workload, c corev1.Container) {
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("container args %v: want --config FILE", c.Args)
	}
	path := c.Args[i+1]
	var data string
	for _, vm := range c.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name != vm.Name || v.ConfigMap == nil {
				continue
			}
			key := rel
			for _, it := range v.ConfigMap.Items {
				if it.Path == rel {
					key = it.Key
				}
			}
			if cm, ok := m.configMaps[v.ConfigMap.Name]; ok {
				data = cm.Data[key]
			}
		}
	}
	if data == "" {
		t.Fatalf("--config %s is not a file of a mounted ConfigMap", path)
	}
	file := filepath.Join(t.TempDir(), "sigwatch.yaml")
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}

	// The pod's environment: the Secret first (envFrom), then env, which
	// wins, with $(VAR) expanded from what is defined before it.
	podEnv := func(podName string, secret map[string]string) []string {
		vars := map[string]string{}
		var order []string
		set := func(k, v string) {
			if _, ok := vars[k]; !ok {
				order = append(order, k)
			}
			vars[k] = v
		}
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil {
				for k := range m.secrets[ef.SecretRef.Name].StringData {
					set(k, secret[k])
				}
			}
		}
		ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				set(e.Name, ref.ReplaceAllStringFunc(e.Value, func(s string) string { return vars[s[2:len(s)-1]] }))
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
				set(e.Name, podName)
			case e.ValueFrom.SecretKeyRef != nil:
				set(e.Name, secret[e.ValueFrom.SecretKeyRef.Key])
			default:
				t.Errorf("env %s: a source this test does not model", e.Name)
			}
		}
		out := []string{"HOSTNAME=" + podName}
		for _, k := range order {
			out = append(out, k+"="+vars[k])
		}
		return out
	}

	var secret map[string]string
	for _, s := range m.secrets {
		secret = s.StringData
	}
	if _, ok := secret["SIGWATCH_HTTP_TOKEN"]; !ok {
		t.Fatal("the Secret has no SIGWATCH_HTTP_TOKEN: http.addr is not loopback in the pod, so the token is required")
	}
	for k, v := range secret {
		if v != "" {
			t.Errorf("Secret key %s ships a value: ship the template empty", k)
		}
	}
	// As shipped (empty tokens) sigwatch refuses, saying what to set.
	if out, err := runSigwatch(t, podEnv(w.name+"-0", secret), "config", "check", "--config", file); err == nil || !strings.Contains(out, "SIGWATCH_HTTP_") {
		t.Errorf("config check with the Secret as shipped (no token): %v %s; want a refusal naming a SIGWATCH_HTTP_ token", err, out)
	}
	filled := map[string]string{}
	var tokens []string
	for k, v := range secret {
		filled[k] = v
		if strings.HasPrefix(k, "SIGWATCH_HTTP_") && strings.HasSuffix(k, "TOKEN") {
			filled[k] = "manifest-check-" + strings.ToLower(k)
			tokens = append(tokens, k)
		}
	}
	// Each token the ConfigMap names is required: without it sigwatch
	// refuses and names it.
	for _, k := range tokens {
		if k == "SIGWATCH_HTTP_TOKEN" {
			continue // http.token: the admin's, kept from before roles
		}
		less := maps.Clone(filled)
		less[k] = ""
		if out, err := runSigwatch(t, podEnv(w.name+"-0", less), "config", "check", "--config", file); err == nil || !strings.Contains(out, k) {
			t.Errorf("config check without %s: %v %s; want a refusal naming it", k, err, out)
		}
	}
	ids := map[string]bool{}
	for _, pod := range []string{"sigwatch-0", "sigwatch-1"} {
		env := podEnv(pod, filled)
		if out, err := runSigwatch(t, env, "config", "check", "--config", file); err != nil {
			t.Errorf("%s: sigwatch config check: %v\n%s", pod, err, out)
		}
		id := ""
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "SIGWATCH_MQTT_CLIENT_ID="); ok {
				id = v
			}
		}
		if id == "" {
			id = "sigwatch-" + pod // the default: sigwatch-<host name>, the pod name
		}
		if ids[id] {
			t.Errorf("two pods share the MQTT client id %s", id)
		}
		ids[id] = true
	}
	// The config loads strictly: a misspelt key in the ConfigMap is refused.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, bytes.Replace([]byte(data), []byte("shared_group:"), []byte("shared_grop:"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runSigwatch(t, podEnv("sigwatch-0", filled), "config", "check", "--config", bad); err == nil {
		t.Errorf("a misspelt key was accepted: %s", out)
	}
}

// TestNoHardCodedClientID: nothing shipped under deploy/ sets one MQTT
// client id that several hosts or pods would share (two connections with one
// id take the broker session from each other); the id comes from the host
// name by default, or from a per-pod variable.
func TestNoHardCodedClientID(t *testing.T) {
	setting := regexp.MustCompile(`^\s*(client_id\s*:|-?\s*name:\s*SIGWATCH_MQTT_CLIENT_ID|SIGWATCH_MQTT_CLIENT_ID\s*[=:])`)
	perHost := regexp.MustCompile(`\$\(POD_NAME\)|%H|\$\{?HOSTNAME`)
	n := 0
	err := filepath.WalkDir(filepath.Join(repoRoot, "deploy"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".sum") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if !setting.MatchString(l) {
				continue
			}
			n++
			// A name: line is followed by its value: line.
			v := l
			if strings.Contains(l, "name:") && i+1 < len(lines) {
				v = lines[i+1]
			}
			if !perHost.MatchString(v) {
				rel, _ := filepath.Rel(repoRoot, path)
				t.Errorf("%s:%d sets one MQTT client id for every host: %s", rel, i+1, strings.TrimSpace(v))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d client id settings, each per pod or host", n)
	// deploy/sigwatch.yaml leaves it to the default, sigwatch-<host name>.
	out, err := runSigwatch(t, nil, "config", "check", "--config", filepath.Join(repoRoot, "deploy", "sigwatch.yaml"))
	if err != nil {
		t.Errorf("deploy/sigwatch.yaml: %v %s", err, out)
	}
}
