// Command kube-network-policies is the NetworkPolicy enforcement of the dev cluster's real node: the
// controller of sigs.k8s.io/kube-network-policies (its Go module, unchanged) run as a host process with a
// kubeconfig, where the upstream command reads the in-cluster ServiceAccount of a DaemonSet pod.
//
// The controller decides each new connection of the node's pods in userspace: the kernel hands it the
// connection's first packet through NFQUEUE, it evaluates the NetworkPolicies of the source and
// destination pods, and answers accept or drop. Upstream puts the packets in the queue with an nftables
// `queue` rule of its own table; the kernels of these machines lack that expression (CONFIG_NFT_QUEUE),
// so its table fails to load (logged, and ignored by the controller) and the dev cluster queues the
// packets with the xtables NFQUEUE target instead (qwen_devtools/devcluster/network.py), which the
// controller reads the same way: the queue is the kernel's, whoever fills it.
package main

import (
	"context"
	"flag"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the identity that reads pods, namespaces and NetworkPolicies")
	nodeName := flag.String("hostname-override", "", "the Node whose pods' connections are decided")
	queueID := flag.Int("nfqueue-id", 100, "the netfilter queue the connections' first packets arrive on")
	metrics := flag.String("metrics-bind-address", "127.0.0.1:9080", "address of /metrics (verdict counters)")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("reading %s: %v", *kubeconfig, err)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("API client: %v", err)
	}
	factory := informers.NewSharedInformerFactory(clientset, 0)
	controller, err := networkpolicy.NewController(
		clientset,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil, // no (Baseline)AdminNetworkPolicy: only the NetworkPolicy API
		networkpolicy.Config{
			QueueID:  *queueID,
			NodeName: *nodeName,
			// NRI stays on, as upstream's default, though the node's containerd runs without it (the
			// plugin's connection fails, logged, and pod addresses come from the API only): with NRI
			// disabled, v0.8.0 dereferences the absent plugin for any address the API has not reported
			// yet (a pod's first packets) and crashes, and with no reader on the queue every new
			// connection to the node's pods is dropped.
			NRIdisabled: false,
			// Kernels from 6.12 have the conntrack fix; the workaround needs the nftables queue too.
			NetfilterBug1766Fix: false,
		},
	)
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	http.Handle("/metrics", promhttp.Handler())
	go func() { klog.Fatal(http.ListenAndServe(*metrics, nil)) }()
	factory.Start(ctx.Done())
	if err := controller.Run(ctx); err != nil {
		klog.Fatalf("controller: %v", err)
	}
}
