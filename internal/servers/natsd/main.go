package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats-server/v2/server"
)

func main() {
	var (
		name        = flag.String("name", "", "server name, unique in the cluster (JetStream needs one)")
		port        = flag.Int("port", 0, "client port")
		httpPort    = flag.Int("http", 0, "monitoring port (varz, healthz, jsz, connz)")
		clusterPort = flag.Int("cluster", 0, "cluster (route) port; 0 runs the server alone")
		mqttPort    = flag.Int("mqtt", 0, "MQTT listener port; 0 runs none")
		clusterName = flag.String("cluster-name", "sigwatch", "cluster name")
		routes      = flag.String("routes", "", "comma-separated nats-route://host:port of the other nodes")
		store       = flag.String("store", "", "JetStream store directory")
	)
	flag.Parse()
	if *name == "" || *store == "" || *port == 0 || *httpPort == 0 {
		fmt.Fprintln(os.Stderr, "natsd: -name, -store, -port and -http are required")
		os.Exit(2)
	}
	o := &server.Options{
		ServerName: *name,
		Host:       "127.0.0.1",
		Port:       *port,
		HTTPHost:   "127.0.0.1",
		HTTPPort:   *httpPort,
		JetStream:  true,
		StoreDir:   *store,
		NoSigs:     true,
	}
	if *clusterPort != 0 {
		o.Routes = server.RoutesFromStr(*routes)
		o.Cluster.Name = *clusterName
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port = *clusterPort
	}
	if *mqttPort != 0 {
		o.MQTT.Host = "127.0.0.1"
		o.MQTT.Port = *mqttPort
	}
	s, err := server.NewServer(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "natsd:", err)
		os.Exit(1)
	}
	// The default logger writes to stderr and exits on a fatal error, such as a port in use:
	// the starter reads that from the log.
	s.ConfigureLogger()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	s.Start()
	go func() {
		<-sigs
		s.Shutdown()
	}()
	s.WaitForShutdown()
}
