// Command tlsstream measures the TLS ceiling of a link for
// bench/compare/compare.py: one TLS 1.3 connection (Go's crypto/tls,
// AES-128-GCM where the CPU has AES instructions, as nexar's bulk path
// seals with) moving 1 GiB in 1 MiB writes, the TLS twin of compare.py's
// plain TCP stream. Run a server and a client per direction; the client
// prints GB/s.
//
//	tlsstream server ADDR PORT [SPAN]
//	tlsstream client ADDR PORT [SPAN]
//
// SPAN is the bytes each end cycles through, 1 MiB at a time (default one
// 1 MiB buffer, in cache; larger moves the data through memory, as a large
// collective's buffers do).
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"strconv"
	"time"
)

const (
	total = 1 << 30
	chunk = 1 << 20
)

func main() {
	if len(os.Args) < 4 {
		fail(fmt.Errorf("usage: tlsstream server|client ADDR PORT [SPAN]"))
	}
	span := chunk
	if len(os.Args) > 4 {
		v, err := strconv.Atoi(os.Args[4])
		if err != nil || v < chunk {
			fail(fmt.Errorf("span %q: want bytes >= %d", os.Args[4], chunk))
		}
		span = v
	}
	addr := net.JoinHostPort(os.Args[2], os.Args[3])
	buf := make([]byte, span)
	var err error
	switch os.Args[1] {
	case "server":
		err = serve(addr, buf)
	case "client":
		var gbs float64
		if gbs, err = send(addr, buf); err == nil {
			fmt.Println(gbs)
		}
	default:
		err = fmt.Errorf("mode %q: want server or client", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tlsstream:", err)
	os.Exit(1)
}

// serve accepts one connection, reads total bytes into buf (cycling) and
// answers one byte.
func serve(addr string, buf []byte) error {
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", addr, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		return err
	}
	defer ln.Close()
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	for got, off := 0, 0; got < total; {
		n, err := c.Read(buf[off : off+chunk])
		if err != nil {
			return err
		}
		got += n
		if off += n; off+chunk > len(buf) {
			off = 0
		}
	}
	_, err = c.Write([]byte{'k'})
	return err
}

// send connects (retrying while the server starts), writes total bytes
// from buf (cycling) and returns GB/s up to the server's answer.
func send(addr string, buf []byte) (float64, error) {
	cfg := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} // a ceiling, not a trust decision
	var c *tls.Conn
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		if c, err = tls.Dial("tcp", addr, cfg); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.Handshake(); err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 0; i < total/chunk; i++ {
		off := i * chunk % len(buf)
		if _, err := c.Write(buf[off : off+chunk]); err != nil {
			return 0, err
		}
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		return 0, err
	}
	return total / time.Since(start).Seconds() / 1e9, nil
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
