// Command e2eimages prints the images the test cluster's nodes hold for
// upstream's sig-network e2e tests, one a line: "KEY NAME", NAME exactly as
// the e2e framework v1.37.2 asks for it (k8s.io/kubernetes/test/utils/image,
// the module test/tools requires), KEY the recipe test/tools/images.sh
// builds it with; then the cluster's DNS, CoreDNS under the name and
// version kubeadm v1.37.2 deploys. With an argument KEY it prints that
// image's NAME alone.
package main

import (
	"fmt"
	"os"

	kubeadmconstants "k8s.io/kubernetes/cmd/kubeadm/app/constants"
	imageutils "k8s.io/kubernetes/test/utils/image"
)

// image is one image the cluster needs and the framework's ID for it.
type image struct {
	key string
	id  imageutils.ImageID
	// name, when set, is the image's name; else the framework's for id.
	name string
}

func (im image) fullName() string {
	if im.name != "" {
		return im.name
	}
	return imageutils.GetE2EImage(im.id)
}

// images are the images of the sig-network tests test/cluster/e2erun
// selects: the pod sandbox, agnhost (nearly every test's server and
// client), busybox (e2epod's default test image), nginx (Endpoints and
// EndpointSlice tests), regression-issue-74839 (Conntrack: INVALID packets)
// and distroless-iptables (KubeProxy: conntrack CLOSE_WAIT timeout). The
// images of DNS tests (glibc-dns-testing) are not here: those tests are not
// selected. TestImagesCoverNetworkTests checks the list against the
// sources.
var images = []image{
	{key: "pause", id: imageutils.Pause},
	{key: "agnhost", id: imageutils.Agnhost},
	{key: "busybox", id: imageutils.BusyBox},
	{key: "nginx", id: imageutils.Nginx},
	{key: "regression-issue-74839", id: imageutils.RegressionIssue74839},
	{key: "distroless-iptables", id: imageutils.DistrolessIptables},
}

// coreDNS is the cluster DNS image (test/tools/coredns): upstream's
// Services tests reach services by name.
var coreDNS = image{key: "coredns", name: "registry.k8s.io/coredns/" + kubeadmconstants.CoreDNSImageName + ":" + kubeadmconstants.CoreDNSVersion}

func main() {
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: e2eimages [KEY]")
		os.Exit(2)
	}
	for _, im := range append(images, coreDNS) {
		name := im.fullName()
		switch {
		case len(os.Args) == 1:
			fmt.Println(im.key, name)
		case os.Args[1] == im.key:
			fmt.Println(name)
			return
		}
	}
	if len(os.Args) == 2 {
		fmt.Fprintf(os.Stderr, "e2eimages: no image %q\n", os.Args[1])
		os.Exit(1)
	}
}
