//go:build !linux

package bulk

// bell is unavailable off Linux, as are rings.
type bell struct{ path string }

func createBell(string) (*bell, error) { return nil, errNoShm }
func openBell(string) (*bell, error)   { return nil, errNoShm }
func (b *bell) ring()                  {}
func (b *bell) wait() error            { return errNoShm }
func (b *bell) unlink()                {}
func (b *bell) Close() error           { return nil }
