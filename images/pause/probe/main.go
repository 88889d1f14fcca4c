// Command probe checks, from inside a pod of the dev cluster, what the real node's tests need: names
// resolved through the pod's DNS settings, the API server reached with the pod's ServiceAccount, and a
// tiny HTTP server to put behind a Service. Each check prints one JSON line; the exit status is 1 when
// any check failed.
//
//	probe [-lookup NAME]... [-get URL]... [-serve ADDR]
//
// -get sends the ServiceAccount token and trusts the ServiceAccount's CA; -serve answers every request
// with "probe <hostname>" and runs until the pod is stopped.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

type result struct {
	Lookup    string   `json:"lookup,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
	Get       string   `json:"get,omitempty"`
	Status    int      `json:"status,omitempty"`
	Error     string   `json:"error,omitempty"`
}

func main() {
	var lookups, gets list
	flag.Var(&lookups, "lookup", "resolve NAME (repeatable)")
	flag.Var(&gets, "get", "HTTPS GET URL with the ServiceAccount token (repeatable)")
	serve := flag.String("serve", "", "after the checks, answer HTTP on ADDR until stopped")
	flag.Parse()

	failed := false
	report := func(r result) {
		failed = failed || r.Error != ""
		line, _ := json.Marshal(r)
		fmt.Println(string(line))
	}
	for _, name := range lookups {
		report(lookup(name))
	}
	if len(gets) > 0 {
		client, err := serviceAccountClient()
		for _, url := range gets {
			if err != nil {
				report(result{Get: url, Error: err.Error()})
				continue
			}
			report(get(client, url))
		}
	}
	if *serve != "" {
		serveForever(*serve)
	}
	if failed {
		os.Exit(1)
	}
}

func lookup(name string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addresses, err := net.DefaultResolver.LookupHost(ctx, name)
	r := result{Lookup: name, Addresses: addresses}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

// serviceAccountClient trusts only the cluster CA the ServiceAccount volume carries.
func serviceAccountClient() (*http.Client, error) {
	ca, err := os.ReadFile(serviceAccount + "/ca.crt")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s/ca.crt", serviceAccount)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Proxy: nil}
	return &http.Client{Transport: transport, Timeout: 10 * time.Second}, nil
}

func get(client *http.Client, url string) result {
	r := result{Get: url}
	token, err := os.ReadFile(serviceAccount + "/token")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	request, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	response, err := client.Do(request)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer response.Body.Close()
	_, _ = io.Copy(io.Discard, response.Body)
	r.Status = response.StatusCode
	return r
}

func serveForever(addr string) {
	hostname, _ := os.Hostname()
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "probe %s\n", hostname)
	})
	server := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
