// k8scheck decodes every document of Kubernetes manifests strictly into the k8s.io/api type its
// apiVersion and kind name, as the API server's strict field validation does: a field the type
// does not have (a misspelling, a wrong nesting), a value of the wrong type (a quantity, a port,
// a duration), or a kind it does not know fails the file. It then checks what the types alone
// do not: each workload's selector matches its pod template's labels, and each Service and
// PodDisruptionBudget selects some pod of the files. It prints one line per document, or the
// errors and exits 1.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

var kinds = map[string]func() any{
	"apps/v1/Deployment":                       func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                      func() any { return &appsv1.StatefulSet{} },
	"batch/v1/Job":                             func() any { return &batchv1.Job{} },
	"v1/ConfigMap":                             func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                func() any { return &corev1.Secret{} },
	"v1/Service":                               func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                        func() any { return &corev1.ServiceAccount{} },
	"v1/PersistentVolumeClaim":                 func() any { return &corev1.PersistentVolumeClaim{} },
	"policy/v1/PodDisruptionBudget":            func() any { return &policyv1.PodDisruptionBudget{} },
	"rbac.authorization.k8s.io/v1/Role":        func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1/RoleBinding": func() any { return &rbacv1.RoleBinding{} },
}

type pods struct {
	where  string
	labels map[string]string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: k8scheck <manifest.yaml>...")
		os.Exit(2)
	}
	var problems []string
	var templates []pods
	var selectors []struct {
		where    string
		selector labels.Selector
	}
	for _, file := range os.Args[1:] {
		documents, err := split(file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", file, err))
			continue
		}
		for index, document := range documents {
			where := fmt.Sprintf("%s#%d", file, index+1)
			object, name, err := decode(document)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
				continue
			}
			where = fmt.Sprintf("%s (%s)", where, name)
			fmt.Println(where)
			switch o := object.(type) {
			case *appsv1.Deployment:
				problems = append(problems, matching(where, o.Spec.Selector, o.Spec.Template.Labels)...)
				templates = append(templates, pods{where, o.Spec.Template.Labels})
			case *appsv1.StatefulSet:
				problems = append(problems, matching(where, o.Spec.Selector, o.Spec.Template.Labels)...)
				templates = append(templates, pods{where, o.Spec.Template.Labels})
			case *batchv1.Job:
				templates = append(templates, pods{where, o.Spec.Template.Labels})
			case *corev1.Service:
				if len(o.Spec.Selector) > 0 {
					selectors = append(selectors, struct {
						where    string
						selector labels.Selector
					}{where, labels.SelectorFromSet(o.Spec.Selector)})
				}
			case *policyv1.PodDisruptionBudget:
				selector, err := metav1.LabelSelectorAsSelector(o.Spec.Selector)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: selector: %v", where, err))
					continue
				}
				selectors = append(selectors, struct {
					where    string
					selector labels.Selector
				}{where, selector})
			}
		}
	}
	for _, s := range selectors {
		found := false
		for _, t := range templates {
			if s.selector.Matches(labels.Set(t.labels)) {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: its selector %q matches no pod template of these files", s.where, s.selector))
		}
	}
	if len(problems) > 0 {
		for _, problem := range problems {
			fmt.Fprintln(os.Stderr, problem)
		}
		os.Exit(1)
	}
}

// split gives the file's YAML documents, empty ones left out.
func split(file string) ([][]byte, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	reader := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(content)))
	var documents [][]byte
	for {
		document, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return documents, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(document))) > 0 {
			documents = append(documents, document)
		}
	}
}

func stripComments(document []byte) []byte {
	var kept []string
	for _, line := range strings.Split(string(document), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return []byte(strings.Join(kept, "\n"))
}

// decode reads a document strictly into the type its apiVersion and kind name.
func decode(document []byte) (any, string, error) {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(document, &meta); err != nil {
		return nil, "", err
	}
	key := meta.APIVersion + "/" + meta.Kind
	make, known := kinds[key]
	if !known {
		return nil, "", fmt.Errorf("apiVersion %q kind %q is not a kind this check knows", meta.APIVersion, meta.Kind)
	}
	object := make()
	if err := yaml.UnmarshalStrict(document, object); err != nil {
		return nil, "", fmt.Errorf("%s: %v", meta.Kind, err)
	}
	var named struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(document, &named); err != nil {
		return nil, "", err
	}
	if named.Metadata.Name == "" {
		return nil, "", fmt.Errorf("%s without metadata.name", meta.Kind)
	}
	return object, meta.Kind + " " + named.Metadata.Name, nil
}

func matching(where string, selector *metav1.LabelSelector, template map[string]string) []string {
	parsed, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return []string{fmt.Sprintf("%s: selector: %v", where, err)}
	}
	if parsed.Empty() || !parsed.Matches(labels.Set(template)) {
		return []string{fmt.Sprintf("%s: spec.selector %q does not match the pod template's labels %v", where, parsed, template)}
	}
	return nil
}
