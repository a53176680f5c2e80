// Package deploy is the server's auto-deploy: the manifests folder
// <data-dir>/server/manifests/ applied with server-side apply, and the
// HelmChart custom resource (helm.cattle.io/v1, as k3s) installed with the
// helm SDK. Both run in the server (supervisor) process only.
package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// ParseError names the line of the file where a document went wrong.
type ParseError struct {
	Line int // 1-based, in the whole file
	Err  string
}

func (e *ParseError) Error() string { return fmt.Sprintf("line %d: %s", e.Line, e.Err) }

var yamlLine = regexp.MustCompile(`line (\d+): `)

// Parse splits a multi-document YAML (or JSON) file into objects; a List
// is expanded into its items. Any bad document fails the whole file, so a
// half-edited file is never half applied.
func Parse(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, doc := range splitDocuments(data) {
		if isBlank(doc.text) {
			continue
		}
		js, err := yaml.YAMLToJSON(doc.text)
		if err != nil {
			msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
			line := doc.line
			// The YAML parser counts lines from the document's start.
			if m := yamlLine.FindStringSubmatchIndex(msg); m != nil {
				n, _ := strconv.Atoi(msg[m[2]:m[3]])
				line = doc.line + n - 1
				msg = msg[:m[0]] + msg[m[1]:]
			}
			return nil, &ParseError{Line: line, Err: msg}
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			return nil, &ParseError{Line: doc.line, Err: "a document must be an object (apiVersion, kind, metadata): " + err.Error()}
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, &ParseError{Line: doc.line, Err: err.Error()}
			}
			for i := range list.Items {
				item := list.Items[i]
				if err := check(&item); err != nil {
					return nil, &ParseError{Line: doc.line, Err: fmt.Sprintf("item %d: %v", i, err)}
				}
				objs = append(objs, &item)
			}
			continue
		}
		if err := check(u); err != nil {
			return nil, &ParseError{Line: doc.line, Err: err.Error()}
		}
		objs = append(objs, u)
	}
	return objs, nil
}

func check(u *unstructured.Unstructured) error {
	switch {
	case u.GetAPIVersion() == "":
		return fmt.Errorf("apiVersion is missing")
	case u.GetKind() == "":
		return fmt.Errorf("kind is missing")
	case u.GetName() == "":
		return fmt.Errorf("%s: metadata.name is missing (generateName cannot be applied)", u.GetKind())
	}
	return nil
}

type document struct {
	line int // where the document's text starts, 1-based
	text []byte
}

// splitDocuments splits at "---" lines, keeping each document's first line.
func splitDocuments(data []byte) []document {
	var docs []document
	cur := document{line: 1}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if l == "---" || strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "---\t") {
			docs = append(docs, cur)
			cur = document{line: n + 1}
			continue
		}
		cur.text = append(append(cur.text, l...), '\n')
	}
	return append(docs, cur)
}

func isBlank(doc []byte) bool {
	for _, l := range bytes.Split(doc, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' {
			return false
		}
	}
	return true
}
