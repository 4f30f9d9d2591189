package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// LoadConfigFile reads a KubeProxyConfiguration from a YAML or JSON file. The
// file must declare apiVersion kubeproxy.config.k8s.io/v1alpha1 and kind
// KubeProxyConfiguration. The result is not defaulted (see Defaults).
//
// Unknown and duplicated fields are handled as upstream does for v1alpha1:
// strict decoding fails, so the file is decoded leniently (unknown fields are
// dropped, the last duplicate wins) and a warning is logged; kproxy's warning
// names every offending field, with its path. Field names are case-sensitive,
// as in upstream's decoder.
func LoadConfigFile(path string) (*v1alpha1.KubeProxyConfiguration, error) {
	c, strictErrs, err := loadConfigFile(path)
	if err != nil {
		return nil, err
	}
	if len(strictErrs) > 0 {
		klog.InfoS("Using lenient decoding as strict decoding failed: these fields are ignored or duplicated",
			"file", path, "fields", strictErrorFields(strictErrs), "err", errors.Join(strictErrs...))
	}
	return c, nil
}

func loadConfigFile(path string) (*v1alpha1.KubeProxyConfiguration, []error, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("reading kube-proxy config file: %w", err)
	}
	c, strictErrs, err := decodeConfig(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, strictErrs, nil
}

// decodeConfig decodes data and returns, separately, the strict decoding
// problems (unknown or duplicate fields) that upstream tolerates.
func decodeConfig(data []byte) (*v1alpha1.KubeProxyConfiguration, []error, error) {
	var strictErrs []error
	// The YAML-to-JSON step is where duplicate keys are seen: the strict
	// conversion rejects them, the lenient one keeps the last value.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		dups := duplicateKeyErrors(err)
		if len(dups) == 0 {
			return nil, nil, fmt.Errorf("not valid YAML or JSON: %w", err)
		}
		strictErrs = append(strictErrs, dups...)
		if js, err = yaml.YAMLToJSON(data); err != nil {
			return nil, nil, fmt.Errorf("not valid YAML or JSON: %w", err)
		}
	}
	// Check the type before the fields, so that a file of another kind gets
	// a clear error rather than a list of "unknown fields".
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(js, &meta); err != nil {
		return nil, nil, fmt.Errorf("not a KubeProxyConfiguration object: %w", err)
	}
	var typeErrs []error
	if meta.APIVersion != APIVersion {
		typeErrs = append(typeErrs, fmt.Errorf("apiVersion is %q, must be %q", meta.APIVersion, APIVersion))
	}
	if meta.Kind != Kind {
		typeErrs = append(typeErrs, fmt.Errorf("kind is %q, must be %q", meta.Kind, Kind))
	}
	if len(typeErrs) > 0 {
		return nil, nil, errors.Join(typeErrs...)
	}

	c := &v1alpha1.KubeProxyConfiguration{}
	// UnmarshalStrict stores everything it can decode and reports the
	// strict-mode problems separately, which is exactly the lenient
	// fallback upstream does in a second pass.
	fieldErrs, err := sigsjson.UnmarshalStrict(js, c)
	if err != nil {
		return nil, nil, fmt.Errorf("decoding: %w", err)
	}
	return c, append(strictErrs, fieldErrs...), nil
}

// duplicateKeyErrors turns the YAML parser's report of duplicate keys
// ("yaml: unmarshal errors:" then one `line N: key "x" already set in map`
// per duplicate) into `duplicate field "x" (line N)` errors. It returns
// nothing when err is about anything else.
func duplicateKeyErrors(err error) []error {
	lines := strings.Split(err.Error(), "\n")
	if len(lines) < 2 || lines[0] != "yaml: unmarshal errors:" {
		return nil
	}
	var dups []error
	for _, line := range lines[1:] {
		pos, rest, ok := strings.Cut(strings.TrimSpace(line), ": key ")
		quoted, ok2 := strings.CutSuffix(rest, " already set in map")
		key, uerr := strconv.Unquote(quoted)
		if !ok || !ok2 || uerr != nil {
			return nil
		}
		dups = append(dups, fmt.Errorf("duplicate field %q (%s)", key, pos))
	}
	return dups
}

// strictErrorFields extracts the quoted field paths from sigs.k8s.io/json
// strict errors (`unknown field "a.b"`, `duplicate field "c"`).
func strictErrorFields(errs []error) []string {
	var fields []string
	for _, e := range errs {
		msg := e.Error()
		start := strings.IndexByte(msg, '"')
		end := strings.LastIndexByte(msg, '"')
		if start >= 0 && end > start {
			fields = append(fields, msg[start+1:end])
		} else {
			fields = append(fields, msg)
		}
	}
	return fields
}

// WriteConfig writes c as YAML with its apiVersion and kind, in the form
// LoadConfigFile reads (what --write-config-to produces).
func WriteConfig(w io.Writer, c *v1alpha1.KubeProxyConfiguration) error {
	out := c.DeepCopy()
	out.APIVersion = APIVersion
	out.Kind = Kind
	data, err := yaml.Marshal(out)
	if err != nil {
		return fmt.Errorf("encoding KubeProxyConfiguration: %w", err)
	}
	_, err = w.Write(data)
	return err
}

// WriteConfigFile writes c to path, see WriteConfig.
func WriteConfigFile(path string, c *v1alpha1.KubeProxyConfiguration) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing kube-proxy config: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("writing kube-proxy config: %w", cerr)
		}
	}()
	if err := WriteConfig(f, c); err != nil {
		return err
	}
	klog.InfoS("Wrote configuration", "file", path)
	return nil
}
