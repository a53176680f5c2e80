package config

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// UnknownKeyError reports a key that the schema does not know, by its path.
type UnknownKeyError struct {
	Path  string // e.g. vm.cpu or spec.clusters[1].dependson
	Line  int
	Known []string
}

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("%s: unknown key (line %d); known keys here: %s", e.Path, e.Line, strings.Join(e.Known, ", "))
}

// StrictUnmarshal decodes YAML into out (a pointer to a struct), first
// rejecting any key that has no matching `yaml` tag, reported with its full
// path. Fields absent from the document keep the value already in out.
// Exported so other klimax manifests (fleet) share the behaviour.
func StrictUnmarshal(data []byte, out any) error {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if err.Error() == "EOF" {
			return nil // empty document: all defaults
		}
		return fmt.Errorf("parse YAML: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return fmt.Errorf("parse YAML: expected one document, found several (remove the extra '---')")
	}
	if err := CheckKnownKeys(&doc, reflect.TypeOf(out)); err != nil {
		return err
	}
	if err := doc.Decode(out); err != nil {
		return fmt.Errorf("parse YAML: %w", err)
	}
	return nil
}

// SchemaProvider is implemented by types with a custom UnmarshalYAML whose
// mapping form should still be checked for unknown keys: YAMLSchema returns a
// value of the plain struct type describing that form.
type SchemaProvider interface{ YAMLSchema() any }

var schemaProviderType = reflect.TypeOf((*SchemaProvider)(nil)).Elem()

// CheckKnownKeys walks n against type t and returns the first unknown key.
func CheckKnownKeys(n *yaml.Node, t reflect.Type) error {
	return checkNode(n, t, "")
}

func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := checkNode(c, t, path); err != nil {
				return err
			}
		}
		return nil
	case yaml.AliasNode:
		return checkNode(n.Alias, t, path)
	}
	// A type with custom decoding can name a plain struct to check keys against.
	if reflect.PointerTo(t).Implements(schemaProviderType) {
		schema := reflect.New(t).Interface().(SchemaProvider).YAMLSchema()
		if n.Kind != yaml.MappingNode {
			return nil
		}
		return checkNode(n, reflect.TypeOf(schema), path)
	}
	// Other types with custom YAML decoding validate themselves.
	if reflect.PointerTo(t).Implements(reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil // type mismatch: the decoder reports it
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // merge key
				if err := checkNode(v, t, path); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[k.Value]
			p := joinPath(path, k.Value)
			if !ok {
				known := make([]string, 0, len(fields))
				for name := range fields {
					known = append(known, name)
				}
				sort.Strings(known)
				return &UnknownKeyError{Path: p, Line: k.Line, Known: known}
			}
			if err := checkNode(v, ft, p); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, c := range n.Content {
			if err := checkNode(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkNode(n.Content[i+1], t.Elem(), joinPath(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps YAML keys to field types, following inline structs.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			for k, v := range yamlFields(ft) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}
