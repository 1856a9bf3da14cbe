package api

import "github.com/gofiber/fiber/v2"

// clientAPI registers the client API (Direct Line 3.0 compatible, camelCase JSON).
func (s *server) clientAPI(r fiber.Router) {}
