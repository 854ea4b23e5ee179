// RUN: stageml-opt %s -p resident-state | filecheck %s

// Buffers the model mutates (bt-split's arguments and results of kind
// "buffer", by name) become ranges of the same flat device tables as resident
// state: each request-time function reads its buffer arguments as views of
// the table and stores each buffer result there instead of returning it, so
// the module keeps the state from call to call and every program shares it
// (@forward and @forward_factorized read and write the one "total"). A
// buffer that starts as zeros needs nothing more (the table's splat); one
// that starts from its value ("scale", bt.initial = "parameter") is written
// into its range once, at load, from a parameter global of its name.

// CHECK-DAG:   util.global private @scale {bt.kind = "parameter", bt.name = "scale"} = #flow.parameter.named<"model"::"scale"> : tensor<2x2xf16>
// CHECK-DAG:   util.global private mutable @resident.f32 = dense<0.000000e+00> : tensor<8xf32>
// CHECK-DAG:   util.global private mutable @resident.f16 = dense<0.000000e+00> : tensor<4xf16>

// CHECK-LABEL: func.func @forward(
// CHECK-SAME:    %arg0: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}) -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"})
// CHECK:         %[[T16:.+]] = util.global.load @resident.f16 : tensor<4xf16>
// CHECK:         %[[S:.+]] = tensor.extract_slice %[[T16]][0] [4] [1] : tensor<4xf16> to tensor<4xf16>
// CHECK:         %[[SCALE:.+]] = tensor.expand_shape %[[S]] {{\[\[}}0, 1]] output_shape [2, 2] : tensor<4xf16> into tensor<2x2xf16>
// CHECK:         %[[T32:.+]] = util.global.load @resident.f32 : tensor<8xf32>
// CHECK:         %[[TOTAL:.+]] = tensor.extract_slice %[[T32]][0] [8] [1] : tensor<8xf32> to tensor<8xf32>
// CHECK:         %[[NEW:.+]] = arith.addf %[[TOTAL]], %[[TOTAL]] : tensor<8xf32>
// CHECK:         %[[SCALED:.+]] = arith.mulf %[[SCALE]], %[[SCALE]] : tensor<2x2xf16>
// CHECK:         %[[L32:.+]] = util.global.load @resident.f32 : tensor<8xf32>
// CHECK:         %[[W32:.+]] = tensor.insert_slice %[[NEW]] into %[[L32]][0] [8] [1] : tensor<8xf32> into tensor<8xf32>
// CHECK:         %[[L16:.+]] = util.global.load @resident.f16 : tensor<4xf16>
// CHECK:         %[[F16:.+]] = tensor.collapse_shape %[[SCALED]] {{\[\[}}0, 1]] : tensor<2x2xf16> into tensor<4xf16>
// CHECK:         %[[W16:.+]] = tensor.insert_slice %[[F16]] into %[[L16]][0] [4] [1] : tensor<4xf16> into tensor<4xf16>
// CHECK-DAG:     util.global.store %[[W32]], @resident.f32 : tensor<8xf32>
// CHECK-DAG:     util.global.store %[[W16]], @resident.f16 : tensor<4xf16>
// CHECK:         return %arg0 : tensor<?x8xf32>

// CHECK-LABEL: func.func @forward_factorized(
// CHECK-SAME:    %arg0: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}) -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"})
// CHECK:         util.global.load @resident.f32 : tensor<8xf32>
// CHECK:         util.global.store %{{.+}}, @resident.f32 : tensor<8xf32>
// CHECK:         return %arg0

// "scale" starts from its parameter, written into the f16 table once:
// CHECK:       util.initializer {
// CHECK:         %[[TABLE:.+]] = util.global.load @resident.f16 : tensor<4xf16>
// CHECK:         %[[START:.+]] = util.global.load @scale : tensor<2x2xf16>
// CHECK:         %[[FLAT:.+]] = tensor.collapse_shape %[[START]] {{\[\[}}0, 1]] : tensor<2x2xf16> into tensor<4xf16>
// CHECK:         %[[INIT:.+]] = tensor.insert_slice %[[FLAT]] into %[[TABLE]][0] [4] [1] : tensor<4xf16> into tensor<4xf16>
// CHECK:         util.global.store %[[INIT]], @resident.f16 : tensor<4xf16>
// CHECK:         util.return

module {
  func.func @forward(%x: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}, %total: tensor<8xf32> {bt.kind = "buffer", bt.name = "total", bt.initial = "zeros"}, %scale: tensor<2x2xf16> {bt.kind = "buffer", bt.name = "scale", bt.initial = "parameter"}) -> (tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}, tensor<2x2xf16> {bt.kind = "buffer", bt.name = "scale"}, tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    %t = arith.addf %total, %total : tensor<8xf32>
    %s = arith.mulf %scale, %scale : tensor<2x2xf16>
    return %t, %s, %x : tensor<8xf32>, tensor<2x2xf16>, tensor<?x8xf32>
  }
  func.func @forward_factorized(%x: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}, %total: tensor<8xf32> {bt.kind = "buffer", bt.name = "total", bt.initial = "zeros"}) -> (tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}, tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %t = arith.addf %total, %total : tensor<8xf32>
    return %t, %x : tensor<8xf32>, tensor<?x8xf32>
  }
}
