package membership

import "context"

// For tests of the layers above, which must see a joiner die between its
// welcome and its report.

// SimulateCrash ends l's connection as a crashed process's would end:
// closed at once, with an error and no report.
func (l *SeedLink) SimulateCrash() { l.conn.CloseWithError(1, "crashed") }

// SimulateSilence makes l's process go silent, as one that was killed: its
// socket is closed under the connection, which sends nothing more. Finish
// or CloseSocket afterwards releases what is left.
func (l *SeedLink) SimulateSilence() { l.sock.udp.Close() }

// CloseSocket releases l's socket.
func (l *SeedLink) CloseSocket() { l.sock.close() }

// AwaitAdmissionPaused is AwaitAdmission for a joiner that, as a stopped
// process, reads nothing from its lobby (and so answers no ping) until
// resume is closed.
func AwaitAdmissionPaused(ctx context.Context, addrs []string, token []byte, resume <-chan struct{}) (Admission, error) {
	return awaitAdmission(ctx, addrs, token, awaitOpts{resume: resume})
}
