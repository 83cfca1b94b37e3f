module github.com/sigwatch/sigwatch/deploy/check

go 1.26.0

require gopkg.in/yaml.v3 v3.0.1
