package model

// Validation of object identity, as the API server does it.
//
// Objects from a file were never checked by an API server, so a Service
// whose port name holds quotes and newlines, or whose name is 1,000
// characters long, would otherwise reach the renderers. The rules below are
// kube-apiserver's (k8s.io/kubernetes pkg/apis/core/validation
// ValidateService and validateServicePort, pkg/apis/discovery/validation
// ValidateEndpointSlice, ValidateNode's metadata), built from the same
// apimachinery functions so that the messages are the API's own. Only the
// rules on what identifies an object or its ports are checked here, and an
// object that breaks one is skipped whole (as if absent); value-level
// problems (an invalid external IP, an endpoint with a bad address) are
// handled per part where the object is converted.

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Reasons are the fixed categories of InvalidError.Category (the reason
// label of the skipped-objects metric: never free text).
const (
	// ReasonInvalidPart: a part of an object (a port, an endpoint, an
	// address) was skipped; the rest of the object is used.
	ReasonInvalidPart = "invalid"
	// The object was skipped whole because of its name, namespace,
	// a port name, a label kproxy reads, its address type, or a limit.
	ReasonName             = "invalid_name"
	ReasonNamespace        = "invalid_namespace"
	ReasonPortName         = "invalid_port_name"
	ReasonLabel            = "invalid_label"
	ReasonServiceNameLabel = "invalid_service_name_label"
	ReasonAddressType      = "invalid_address_type"
	ReasonTooMany          = "too_many_items"
	// ReasonNoPorts: a Service that needs ports has none (the API server
	// requires them unless the service is headless or ExternalName).
	ReasonNoPorts = "no_ports"
)

// Limits of an EndpointSlice (k8s.io/kubernetes
// pkg/apis/discovery/validation, v1.37: maxEndpoints, maxPorts).
const (
	MaxSliceEndpoints = 1000
	MaxSlicePorts     = 20000
)

// labelsRead are the labels kproxy reads from Services and EndpointSlices;
// their values must be valid label values.
var labelsRead = []string{LabelServiceProxyName, LabelHeadless}

// validator collects identity errors of one object.
type validator struct {
	kind, obj string
	errs      []*InvalidError
}

func (v *validator) add(category string, errs field.ErrorList) {
	for _, e := range errs {
		if s, ok := e.BadValue.(string); ok {
			e.BadValue = clipTo(s, maxBadValue)
		}
		v.errs = append(v.errs, &InvalidError{Kind: v.kind, Object: clip(v.obj), Field: e.Field, Reason: clip(e.ErrorBody()), Category: category, Whole: true})
	}
}

// meta checks name and namespace (namespaced objects) as
// ValidateObjectMeta does.
func (v *validator) meta(name, namespace string, namespaced bool, nameFn apivalidation.ValidateNameFunc, nameMax int) {
	p := field.NewPath("metadata")
	if name == "" {
		v.add(ReasonName, field.ErrorList{field.Required(p.Child("name"), "name or generateName is required")})
	} else if len(name) > patternLimit {
		v.add(ReasonName, field.ErrorList{field.Invalid(p.Child("name"), name, validation.MaxLenError(nameMax))})
	} else {
		for _, msg := range nameFn(name, false) {
			v.add(ReasonName, field.ErrorList{field.Invalid(p.Child("name"), name, msg)})
		}
	}
	if !namespaced {
		return
	}
	if namespace == "" {
		v.add(ReasonNamespace, field.ErrorList{field.Required(p.Child("namespace"), "")})
		return
	}
	if len(namespace) > patternLimit {
		v.add(ReasonNamespace, field.ErrorList{field.Invalid(p.Child("namespace"), namespace, validation.MaxLenError(validation.DNS1123LabelMaxLength))})
		return
	}
	for _, msg := range apivalidation.ValidateNamespaceName(namespace, false) {
		v.add(ReasonNamespace, field.ErrorList{field.Invalid(p.Child("namespace"), namespace, msg)})
	}
}

// patternLimit: a name, label value or port name longer than this is
// refused on its length alone (with the API's message for the length),
// not given to the API's pattern: a file may hold one of megabytes, and
// the pattern takes seconds over it. Shorter ones get the API's messages.
const patternLimit = 4096

// label checks the value of one label kproxy reads, when present.
func (v *validator) label(labels map[string]string, key, category string) {
	val, ok := labels[key]
	if !ok {
		return
	}
	p := field.NewPath("metadata", "labels").Key(key)
	if len(val) > patternLimit {
		v.add(category, field.ErrorList{field.Invalid(p, val, fmt.Sprintf("must be no more than %d bytes", validation.LabelValueMaxLength))})
		return
	}
	for _, msg := range validation.IsValidLabelValue(val) {
		v.add(category, field.ErrorList{field.Invalid(p, val, msg)})
	}
}

// ValidateService returns the identity errors of a Service: its name
// (DNS-1123 label: the API server has taken names starting with a digit
// since RelaxedServiceNameValidation, so a stricter check here would drop
// Services it stores), namespace (DNS-1123 label), the labels kproxy reads,
// its port names (DNS-1123 labels, required and unique when there are
// several ports) and that it has ports at all unless it is headless or
// ExternalName. A Service with any is not proxied.
func ValidateService(svc *v1.Service) []*InvalidError {
	v := validator{kind: "Service", obj: svc.Namespace + "/" + svc.Name}
	v.meta(svc.Name, svc.Namespace, true, apivalidation.NameIsDNSLabel, validation.DNS1123LabelMaxLength)
	for _, k := range labelsRead {
		v.label(svc.Labels, k, ReasonLabel)
	}
	if len(svc.Spec.Ports) == 0 && svc.Spec.Type != v1.ServiceTypeExternalName && svc.Spec.ClusterIP != v1.ClusterIPNone {
		v.add(ReasonNoPorts, field.ErrorList{field.Required(field.NewPath("spec", "ports"), "")})
	}
	names := sets.New[string]()
	requireName := len(svc.Spec.Ports) > 1
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		p := field.NewPath("spec", "ports").Index(i).Child("name")
		switch {
		case requireName && sp.Name == "":
			v.add(ReasonPortName, field.ErrorList{field.Required(p, "")})
		case len(sp.Name) > patternLimit:
			v.add(ReasonPortName, field.ErrorList{field.Invalid(p, sp.Name, validation.MaxLenError(validation.DNS1123LabelMaxLength))})
		case sp.Name != "":
			for _, msg := range validation.IsDNS1123Label(sp.Name) {
				v.add(ReasonPortName, field.ErrorList{field.Invalid(p, sp.Name, msg)})
			}
			if names.Has(sp.Name) {
				v.add(ReasonPortName, field.ErrorList{field.Duplicate(p, sp.Name)})
			}
			names.Insert(sp.Name)
		}
	}
	return v.errs
}

// ValidateEndpointSlice returns the identity errors of an EndpointSlice:
// its name (DNS subdomain), namespace, the kubernetes.io/service-name label
// (a valid label value) and the other labels kproxy reads, its address
// type, its port names (DNS-1123 labels when set, unique) and the limits of
// 1000 endpoints and 20000 ports. A slice with any is not used.
func ValidateEndpointSlice(s *discovery.EndpointSlice) []*InvalidError {
	v := validator{kind: "EndpointSlice", obj: s.Namespace + "/" + s.Name}
	v.meta(s.Name, s.Namespace, true, apivalidation.NameIsDNSSubdomain, validation.DNS1123SubdomainMaxLength)
	v.label(s.Labels, discovery.LabelServiceName, ReasonServiceNameLabel)
	for _, k := range labelsRead {
		v.label(s.Labels, k, ReasonLabel)
	}
	switch s.AddressType {
	case discovery.AddressTypeIPv4, discovery.AddressTypeIPv6, discovery.AddressTypeFQDN:
	case "":
		v.add(ReasonAddressType, field.ErrorList{field.Required(field.NewPath("addressType"), "")})
	default:
		v.add(ReasonAddressType, field.ErrorList{field.NotSupported(field.NewPath("addressType"), s.AddressType,
			[]string{string(discovery.AddressTypeIPv4), string(discovery.AddressTypeIPv6), string(discovery.AddressTypeFQDN)})})
	}
	if len(s.Endpoints) > MaxSliceEndpoints {
		v.add(ReasonTooMany, field.ErrorList{field.TooMany(field.NewPath("endpoints"), len(s.Endpoints), MaxSliceEndpoints)})
	}
	if len(s.Ports) > MaxSlicePorts {
		v.add(ReasonTooMany, field.ErrorList{field.TooMany(field.NewPath("ports"), len(s.Ports), MaxSlicePorts)})
		return v.errs
	}
	names := make([]string, 0, len(s.Ports))
	for i, p := range s.Ports {
		if p.Name == nil {
			continue // the API server defaults it to ""; convertSlice skips the port
		}
		fp := field.NewPath("ports").Index(i).Child("name")
		if len(*p.Name) > patternLimit {
			v.add(ReasonPortName, field.ErrorList{field.Invalid(fp, *p.Name, validation.MaxLenError(validation.DNS1123LabelMaxLength))})
		} else if *p.Name != "" {
			for _, msg := range validation.IsDNS1123Label(*p.Name) {
				v.add(ReasonPortName, field.ErrorList{field.Invalid(fp, *p.Name, msg)})
			}
		}
		if slices.Contains(names, *p.Name) {
			v.add(ReasonPortName, field.ErrorList{field.Duplicate(fp, *p.Name)})
		} else {
			names = append(names, *p.Name)
		}
	}
	return v.errs
}

// ValidateNode returns the identity errors of a Node: its name (DNS
// subdomain) and the labels kproxy reads (the zone).
func ValidateNode(n *v1.Node) []*InvalidError {
	v := validator{kind: "Node", obj: n.Name}
	v.meta(n.Name, "", false, apivalidation.NameIsDNSSubdomain, validation.DNS1123SubdomainMaxLength)
	v.label(n.Labels, v1.LabelTopologyZone, ReasonLabel)
	return v.errs
}
