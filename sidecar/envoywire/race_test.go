//go:build race

package envoywire

const raceEnabled = true
