module qwenops.dev/images/pause

go 1.26
