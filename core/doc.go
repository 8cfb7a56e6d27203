// Package core is nexar's communicator: it turns a transport mesh into a
// Comm with MPI-style point-to-point messages and collectives.
//
// A Comm owns the matching of messages (communicator id, operation sequence
// number, step; or source and tag for point-to-point), the signature checks
// that make mismatched collective calls fail loudly on every rank, failure
// detection by heartbeats on a lane of their own, and the rendezvous that
// forms a job (a seed that assigns ranks and hands out the peer table to
// joiners that prove knowledge of the job's token).
//
// The wire layout of the 56-byte message header is described in
// docs/wire-format.md and next to header.encode in header.go.
package core
