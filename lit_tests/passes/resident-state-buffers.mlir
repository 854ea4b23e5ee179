// RUN: stageml-opt %s -p resident-state | filecheck %s

// Buffers the model mutates (bt-split's arguments and results of kind
// "buffer", by name) become mutable globals of their own, @buffer.<name>,
// starting from the parameter of their name: each request-time function
// loads its buffers instead of taking them and stores their new values
// instead of returning them, so the module keeps the state from call to call
// and every program shares it (@forward and @forward_factorized load and
// store the one @buffer.total).

// CHECK-DAG:   util.global private mutable @buffer.total {bt.kind = "buffer", bt.name = "total"} = #flow.parameter.named<"model"::"total"> : tensor<8xf32>
// CHECK-DAG:   util.global private mutable @buffer.scale {bt.kind = "buffer", bt.name = "scale"} = #flow.parameter.named<"model"::"scale"> : tensor<2x2xf16>

// CHECK-LABEL: func.func @forward(
// CHECK-SAME:    %arg0: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}) -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"})
// CHECK-DAG:     %[[SCALE:.+]] = util.global.load @buffer.scale : tensor<2x2xf16>
// CHECK-DAG:     %[[TOTAL:.+]] = util.global.load @buffer.total : tensor<8xf32>
// CHECK:         %[[NEW:.+]] = arith.addf %[[TOTAL]], %[[TOTAL]] : tensor<8xf32>
// CHECK:         %[[SCALED:.+]] = arith.mulf %[[SCALE]], %[[SCALE]] : tensor<2x2xf16>
// CHECK:         util.global.store %[[NEW]], @buffer.total : tensor<8xf32>
// CHECK:         util.global.store %[[SCALED]], @buffer.scale : tensor<2x2xf16>
// CHECK:         return %arg0 : tensor<?x8xf32>

// CHECK-LABEL: func.func @forward_factorized(
// CHECK-SAME:    %arg0: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}) -> (tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"})
// CHECK:         %[[T:.+]] = util.global.load @buffer.total : tensor<8xf32>
// CHECK:         %[[U:.+]] = arith.addf %[[T]], %[[T]] : tensor<8xf32>
// CHECK:         util.global.store %[[U]], @buffer.total : tensor<8xf32>
// CHECK:         return %arg0

module {
  func.func @forward(%x: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}, %total: tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}, %scale: tensor<2x2xf16> {bt.kind = "buffer", bt.name = "scale"}) -> (tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}, tensor<2x2xf16> {bt.kind = "buffer", bt.name = "scale"}, tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "main", bt.stage = "dynamic"} {
    %t = arith.addf %total, %total : tensor<8xf32>
    %s = arith.mulf %scale, %scale : tensor<2x2xf16>
    return %t, %s, %x : tensor<8xf32>, tensor<2x2xf16>, tensor<?x8xf32>
  }
  func.func @forward_factorized(%x: tensor<?x8xf32> {bt.kind = "input", bt.name = "x"}, %total: tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}) -> (tensor<8xf32> {bt.kind = "buffer", bt.name = "total"}, tensor<?x8xf32> {bt.kind = "output", bt.name = "output.0"}) attributes {bt.program = "factorized", bt.stage = "dynamic"} {
    %t = arith.addf %total, %total : tensor<8xf32>
    return %t, %x : tensor<8xf32>, tensor<?x8xf32>
  }
}
