package main

import (
	"os"

	"github.com/sirupsen/logrus"
)

// quietLogrus keeps the client's own logging to warnings and errors (its info lines would drown
// the one JSON line this program prints).
func quietLogrus() *logrus.Logger {
	logger := logrus.New()
	logger.SetLevel(logrus.WarnLevel)
	logger.SetOutput(os.Stderr)
	return logger
}
