// RUN: stageml-opt %s -p hoist-asserts | filecheck %s

// The residual after the target's passes: runtime assertions where the
// lowering left them, between the request's tensor ops (bt-gather's row
// check once per LoRA site, torch-mlir's broadcast checks), their conditions'
// size arithmetic beside them. Each assertion moves up to just after its
// condition, whose arithmetic moves up first as far as its operands allow;
// moved ops keep their order. A repeat of the same condition and message
// goes: the two row checks of %rows become one, ahead of both products. The
// same condition with another message stays. The division %per, which came
// after "no ids", stays after it. A condition on a product's result (%late)
// moves no higher than that product. An assertion in a nested region stays
// in its block, at its start when the condition comes from outside.

// CHECK-LABEL: func.func @forward
// CHECK:         %[[N:.+]] = tensor.dim %arg0, %c0
// CHECK-NEXT:    %[[B:.+]] = tensor.dim %arg1, %c0
// CHECK-NEXT:    %[[ROWS:.+]] = arith.cmpi eq, %[[N]], %[[B]]
// CHECK-NEXT:    cf.assert %[[ROWS]], "rows do not line up"
// CHECK-NEXT:    %[[IDS:.+]] = arith.cmpi ne, %[[B]], %c0
// CHECK-NEXT:    cf.assert %[[IDS]], "no ids"
// CHECK-NEXT:    %[[PER:.+]] = arith.divsi %[[N]], %[[B]]
// CHECK-NEXT:    %[[WHOLE:.+]] = arith.muli %[[PER]], %[[B]]
// CHECK-NEXT:    %[[EVEN:.+]] = arith.cmpi eq, %[[WHOLE]], %[[N]]
// CHECK-NEXT:    cf.assert %[[ROWS]], "another check"
// CHECK-NEXT:    cf.assert %[[EVEN]], "uneven rows"
// CHECK-NEXT:    arith.constant 0.0
// CHECK-NEXT:    tensor.empty
// CHECK-NEXT:    linalg.fill
// CHECK-NEXT:    %[[Y0:.+]] = linalg.matmul
// CHECK-NEXT:    %[[D:.+]] = tensor.dim %[[Y0]], %c0
// CHECK-NEXT:    %[[LATE:.+]] = arith.cmpi sle, %[[D]], %c128
// CHECK-NEXT:    cf.assert %[[LATE]], "too many rows"
// CHECK-NEXT:    %[[Y1:.+]] = linalg.matmul
// CHECK-NEXT:    scf.if %[[ROWS]]
// CHECK-NEXT:      cf.assert %[[ROWS]], "rows do not line up"
// CHECK-NEXT:      func.call @log
// CHECK:         return %[[Y1]]

func.func private @log()

func.func @forward(%arg0: tensor<?x64xf32>, %arg1: tensor<?xi64>, %w: tensor<64x64xf32>) -> tensor<?x64xf32> {
  %c0 = arith.constant 0 : index
  %c128 = arith.constant 128 : index
  %zero = arith.constant 0.0 : f32
  %n = tensor.dim %arg0, %c0 : tensor<?x64xf32>
  %b = tensor.dim %arg1, %c0 : tensor<?xi64>
  %rows = arith.cmpi eq, %n, %b : index
  %e = tensor.empty(%n) : tensor<?x64xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x64xf32>) -> tensor<?x64xf32>
  cf.assert %rows, "rows do not line up"
  %y0 = linalg.matmul ins(%arg0, %w : tensor<?x64xf32>, tensor<64x64xf32>) outs(%z : tensor<?x64xf32>) -> tensor<?x64xf32>
  %ids = arith.cmpi ne, %b, %c0 : index
  cf.assert %ids, "no ids"
  %per = arith.divsi %n, %b : index
  %whole = arith.muli %per, %b : index
  %even = arith.cmpi eq, %whole, %n : index
  %d = tensor.dim %y0, %c0 : tensor<?x64xf32>
  %late = arith.cmpi sle, %d, %c128 : index
  cf.assert %rows, "rows do not line up"
  cf.assert %rows, "another check"
  cf.assert %even, "uneven rows"
  cf.assert %late, "too many rows"
  %y1 = linalg.matmul ins(%y0, %w : tensor<?x64xf32>, tensor<64x64xf32>) outs(%z : tensor<?x64xf32>) -> tensor<?x64xf32>
  scf.if %rows {
    func.call @log() : () -> ()
    cf.assert %rows, "rows do not line up"
  }
  return %y1 : tensor<?x64xf32>
}
